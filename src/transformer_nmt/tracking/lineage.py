"""Lineage: what a run records about its data (settings, checksums, MLflow dataset inputs).

``data_record`` gives the data-stage settings (params) and the checksums of the token arrays
(tags). ``data_inputs`` names the raw corpus files behind a run's splits as MLflow dataset
inputs (the run page's *Datasets*): one per file and use, its source the file's URL (or its
path in the mirror, ``$TRANSFORMER_NMT_MIRROR``, when one is set; a local dataset's file its
``file://`` URI; a split carved out of the training data the training files, named
``<dataset>/<file> (<split>, carved)``), its digest the file's sha256
(the registry's, else ``resources/<dataset>/checksums.lock.json``'s; MLflow keeps at most 36
characters of a digest, so its first 36 hex digits, the whole sum in the input's tag
``transformer_nmt.sha256``), its context ``training``, ``validation`` or ``test``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SPM_NOT_SETTINGS = ("input_lines", "sha256")
REGISTRY_ENV = "TRANSFORMER_NMT_REGISTRY"  # set by the Snakefile for every job
RAW_ROOT = "resources"  # raw downloads: resources/<dataset>/<file> (experiments/paths.py)
DIGEST_CHARS = 36  # mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE
SHA256_TAG = "transformer_nmt.sha256"
SPLIT_TAG = "transformer_nmt.split"


@dataclass(frozen=True)
class DataInput:
    """One raw corpus file used by a run: an MLflow dataset input."""

    name: str  # <dataset>/<file>
    source: str  # its URL, or its path in the mirror
    sha256: str
    context: str  # training | validation | test
    split: str

    @property
    def digest(self) -> str:
        return self.sha256[:DIGEST_CHARS]


def default_registry() -> Path:
    """``$TRANSFORMER_NMT_REGISTRY``, else the package's registry (``config/datasets.yaml``)."""
    from transformer_nmt.data.registry import DEFAULT_REGISTRY

    env = os.environ.get(REGISTRY_ENV)
    return Path(env) if env else DEFAULT_REGISTRY


def data_inputs(
    clean_report: str | os.PathLike[str],
    contexts: Mapping[str, str],
    registry: str | os.PathLike[str] | None = None,
    raw_root: str | os.PathLike[str] = RAW_ROOT,
) -> list[DataInput]:
    """The raw files behind each split of ``contexts`` (split -> MLflow context) of the
    dataset pair that ``clean_report`` (``prepare``'s report) was made from, per the registry
    (default ``default_registry()``). A file whose sha256 is known nowhere is left out."""
    from transformer_nmt.data.download import expected_sha256, read_lock, resolve_mirror
    from transformer_nmt.data.registry import get_dataset
    from transformer_nmt.errors import DataError

    report = json.loads(Path(clean_report).read_text(encoding="utf-8"))
    if not isinstance(report, dict) or not {"dataset", "pair"} <= set(report):
        raise DataError(f"{clean_report}: no 'dataset' and 'pair' (not written by prepare)")
    dataset = get_dataset(registry or default_registry(), report["dataset"])
    pair = dataset.pair(report["pair"])
    raw_dir = Path(raw_root) / dataset.name
    lock = read_lock(raw_dir)
    mirror = resolve_mirror(None)
    inputs: dict[tuple[str, str], DataInput] = {}
    for split, context in contexts.items():
        # a split carved out of the training data (a local dataset's) comes from train's files
        from_files = split if split in pair.splits or split not in pair.carve else "train"
        for corpus in pair.splits.get(from_files, []):
            for side in corpus.sides.values():
                spec = dataset.files[side.file]
                sha256 = expected_sha256(spec, lock, raw_dir)
                if sha256 is None or (spec.name, context) in inputs:
                    continue
                mirrored = mirror is not None and spec.path is None  # a local file: its own
                source = (
                    str((mirror / dataset.name / spec.name).resolve()) if mirrored else spec.url
                )
                name = f"{dataset.name}/{spec.name}"
                if from_files != split:  # MLflow keeps one input per dataset: name the split
                    name += f" ({split}, carved)"
                inputs[(spec.name, context)] = DataInput(name, source, sha256, context, split)
    return list(inputs.values())


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
