"""Lineage: what a run records about the data it was trained on (settings and checksums)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_SPM_NOT_SETTINGS = ("input_lines", "sha256")


def data_record(
    spm_model: str | os.PathLike[str],
    vocab_size: int,
    clean_report: str | os.PathLike[str] | None,
    bin_dir: str | os.PathLike[str],
    splits: Mapping[str, tuple[str, ...]],
) -> tuple[dict[str, Any], dict[str, str]]:
    """The data-stage settings and data checksums of a run, as ``(shared_params, tags)``.

    Params (for ``stage_run(shared_params=...)``): ``data.vocab_size``, ``data.spm.*`` (the
    settings in ``spm.json`` beside ``spm_model``), ``data.dataset``, ``data.pair`` and
    ``data.clean.*`` (the rules in ``clean_report``). Tags: ``data.spm_sha256`` and the sha256
    of each token array, ``data.<split>.<lang>.tokens_sha256`` / ``.offsets_sha256``, for
    ``splits`` = ``{split: (lang, ...)}``. A missing ``spm.json`` or report is left out.
    """
    from transformer_nmt.data.token_array import array_paths
    from transformer_nmt.io_utils import sha256_file

    spm_model = Path(spm_model)
    data: dict[str, Any] = {"vocab_size": vocab_size}
    spm_json = spm_model.with_suffix(".json")
    if spm_json.is_file():
        settings = json.loads(spm_json.read_text(encoding="utf-8"))
        data["spm"] = {k: v for k, v in settings.items() if k not in _SPM_NOT_SETTINGS}
    if clean_report is not None and Path(clean_report).is_file():
        report = json.loads(Path(clean_report).read_text(encoding="utf-8"))
        data.update({k: report[k] for k in ("dataset", "pair") if k in report})
        data["clean"] = report.get("rules", {})
    tags = {"data.spm_sha256": sha256_file(spm_model)}
    for split, langs in splits.items():
        for lang in langs:
            tokens, offsets = array_paths(Path(bin_dir) / f"{split}.{lang}")
            for kind, path in (("tokens", tokens), ("offsets", offsets)):
                if path.is_file():
                    tags[f"data.{split}.{lang}.{kind}_sha256"] = sha256_file(path)
    return {"data": data}, tags
