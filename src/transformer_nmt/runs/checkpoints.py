"""Checkpoints: discovery of Lightning checkpoints, averaging (§6.1), model files.

Two kinds of files (docs/interfaces.md):

* Lightning checkpoints ``<run-dir>/checkpoints/step=00001000.ckpt``: the full training state
  (weights, optimizer, schedule, loops, data sampler) used to resume. The LightningModule keeps
  the Transformer as ``self.model``, so model weights are the ``state_dict`` entries under the
  ``model.`` prefix; ``hyper_parameters`` hold plain types only (``model_config``, ``vocab``,
  ...), so the files load with ``torch.load(..., weights_only=True)``.
  Only the newest one keeps that state: when a run writes a new checkpoint, the older ones it
  keeps for §6.1 averaging become weights-only (``demote_to_weights_only``: the optimizer's
  moments, schedule, loops and callbacks removed, ``WEIGHTS_ONLY_KEY`` set), a third of the
  disk of a full one with Adam.
* Model files (``averaged.pt``): the unwrapped Transformer's weights, its config, the vocab
  identity, the step and the source checkpoints, in the ``transformer_nmt.model/1`` format.

§6.1: "For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we averaged the
last 20 checkpoints."
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.errors import CheckpointError
from transformer_nmt.io_utils import atomic_path
from transformer_nmt.removed_keys import RELEASE, without_removed

MODEL_FILE_FORMAT = "transformer_nmt.model/1"
# The last commit that read checkpoints written before release 0.1.0.
PRE_RELEASE_READER = "92c2222"
# The LightningModule's attribute holding the Transformer (training/module.py).
MODEL_PREFIX = "model."
# ModelCheckpoint's ``filename`` template (Lightning adds ".ckpt"): gives ``checkpoint_name``.
LIGHTNING_FILENAME = "step={step:08d}"
# Lightning checkpoint entry: what the run learns from (fingerprint, model config, the train
# settings of ``training.config.learning_settings``); a resume needs the same fingerprint.
LEARNING_KEY = "transformer_nmt_learning"
_STEP_RE = re.compile(r"^step=(\d+)\.ckpt$")
# Set in a Lightning checkpoint that holds only what averaging and the resume checks read.
WEIGHTS_ONLY_KEY = "transformer_nmt_weights_only"
# What a weights-only checkpoint keeps: the weights, the step, the settings they came from.
_WEIGHTS_ONLY_KEEPS = (
    "epoch", "global_step", "pytorch-lightning_version", "state_dict", "hparams_name",
    "hyper_parameters", LEARNING_KEY,
)  # fmt: skip


def checkpoint_name(step: int) -> str:
    """File name of the Lightning checkpoint written at optimizer step ``step``."""
    return LIGHTNING_FILENAME.format(step=step) + ".ckpt"


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The step in a ``step=NNNNNNNN.ckpt`` file name, or None for any other name."""
    match = _STEP_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Lightning checkpoints ``step=*.ckpt`` in ``directory``, sorted by step (oldest first).

    A missing directory has no checkpoints. Temporary and other files are ignored.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in directory.iterdir() if p.is_file()]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)]


def load_checkpoint(path: str | os.PathLike[str], *, mmap: bool = False) -> dict[str, Any]:
    """``torch.load`` a checkpoint or model file (weights only, on CPU) or raise CheckpointError.

    ``mmap``: the tensors stay in the file and are read in page by page when used (metadata
    reads and averaging then never hold the optimizer's moments, or a whole file, in memory)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # truncated zip, pickle error, disallowed global, ...
        raise CheckpointError(
            f"{path}: cannot be read as a weights-only torch checkpoint "
            f"({type(err).__name__}: {_first_line(err)})"
        ) from err
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: expected a dict, found {type(payload).__name__}")
    state = payload.get("state_dict")
    if isinstance(state, Mapping) and any(".self_attn.w_k." in key for key in state):
        raise_pre_release(path, "separate attention projections w_q, w_k, w_v")
    return payload


class PreReleaseFile(CheckpointError):
    """A checkpoint or model file written before release 0.1.0, which nothing reads now."""


def raise_pre_release(path: str | os.PathLike[str], what: str) -> None:
    """The one-line refusal of a file written before release 0.1.0 (``what`` it has)."""
    raise PreReleaseFile(
        f"{path}: written before release {RELEASE} ({what}); retrain, or read it with "
        f"commit {PRE_RELEASE_READER}, the last one that did"
    )


def is_weights_only(payload: Mapping[str, Any]) -> bool:
    """Whether a loaded Lightning checkpoint was demoted to weights only (it cannot resume)."""
    return bool(payload.get(WEIGHTS_ONLY_KEY))


def demote_to_weights_only(path: str | os.PathLike[str]) -> bool:
    """Rewrite the Lightning checkpoint ``path`` without its training state (optimizer moments,
    schedule, loops, callbacks), atomically: the file is whole, full or weights-only, whenever
    the writer is killed. Returns False when it already was weights-only."""
    path = Path(path)
    payload = load_checkpoint(path, mmap=True)  # the optimizer's moments are never read in
    if is_weights_only(payload):
        return False
    slim = {key: payload[key] for key in _WEIGHTS_ONLY_KEEPS if key in payload}
    slim[WEIGHTS_ONLY_KEY] = True
    with atomic_path(path) as tmp:
        torch.save(slim, tmp)
    return True


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no detail"


def model_state_dict(payload: Mapping[str, Any], path: str | os.PathLike[str]) -> dict:
    """The Transformer's weights from a Lightning checkpoint or a model file's payload."""
    if payload.get("format") == MODEL_FILE_FORMAT:
        state = payload.get("state_dict")
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{path}: model file without a state_dict")
        return dict(state)
    state = payload.get("state_dict")
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{path}: neither a Lightning checkpoint nor a {MODEL_FILE_FORMAT} file "
            f"(top-level keys: {sorted(payload)[:8]})"
        )
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    if not weights:
        raise CheckpointError(f"{path}: no '{MODEL_PREFIX}*' weights in its state_dict")
    return weights


def checkpoint_meta(payload: Mapping[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """``model_config``, ``vocab`` and ``step`` of a Lightning checkpoint or model file."""
    if payload.get("format") == MODEL_FILE_FORMAT:
        meta = {k: payload.get(k) for k in ("model_config", "vocab", "step")}
    else:
        hparams = payload.get("hyper_parameters") or {}
        meta = {
            "model_config": hparams.get("model_config"),
            "vocab": hparams.get("vocab"),
            "step": payload.get("global_step"),
        }
    for key in ("model_config", "vocab"):
        if not isinstance(meta[key], Mapping):
            raise CheckpointError(f"{path}: no '{key}' recorded in the checkpoint")
    meta["model_config"] = without_removed("model", meta["model_config"])
    return meta


def experiment_mismatch(
    meta: Mapping[str, Any],
    *,
    model_config: Mapping[str, Any] | None,
    vocab_sha256: str,
) -> str | None:
    """How a checkpoint's ``meta`` (``checkpoint_meta``) belongs to another experiment than
    ``model_config`` + the vocabulary ``vocab_sha256``, or None when it is the same one.

    The one rule of "same experiment", used by resume, averaging and translation; a
    ``model_config`` of None checks the vocabulary only (a translator takes the model's own).
    """
    if model_config is not None:
        recorded, wanted = meta["model_config"], model_config
        diff = sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))
        if diff:
            return f"another model config (differs in {diff})"
    recorded_sha = meta["vocab"].get("sha256")
    if recorded_sha != vocab_sha256:
        return f"another vocabulary (sha256 {recorded_sha}, expected {vocab_sha256})"
    return None


def average_checkpoints(paths: Sequence[str | os.PathLike[str]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the model weights of ``paths`` (§6.1 checkpoint averaging).

    Floating tensors are accumulated in fp32 (fp64 for fp64 weights) and cast back to their
    original dtype; integer buffers must be equal in every checkpoint. Every checkpoint must
    have the same keys and shapes as the first, else CheckpointError names the file.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    # One file at a time, memory-mapped: the accumulators and one file's weights in memory
    # (with float32 weights about 2x the model; the optimizer's moments are never read).
    first = Path(paths[0])
    reference = model_state_dict(load_checkpoint(first, mmap=True), first)
    shapes = {k: v.shape for k, v in reference.items()}
    dtypes = {k: v.dtype for k, v in reference.items()}
    sums = {k: _accumulator(v) for k, v in reference.items()}  # copies: no page of the file kept
    del reference
    for path in paths[1:]:
        path = Path(path)
        state = model_state_dict(load_checkpoint(path, mmap=True), path)
        if state.keys() != shapes.keys():
            missing = sorted(shapes.keys() - state.keys())[:5]
            extra = sorted(state.keys() - shapes.keys())[:5]
            raise CheckpointError(
                f"{path}: weights differ from {first.name}: missing {missing}, extra {extra}"
            )
        for key, value in state.items():
            if value.shape != shapes[key]:
                raise CheckpointError(
                    f"{path}: '{key}' has shape {tuple(value.shape)}, "
                    f"{first.name} has {tuple(shapes[key])}"
                )
            if value.is_floating_point():
                sums[key] += value.to(sums[key].dtype)
            elif not torch.equal(value, sums[key]):
                raise CheckpointError(f"{path}: non-float tensor '{key}' differs from {first.name}")
        del state
    n = len(paths)
    # in place: no second copy of the model (the float32 accumulators become the average)
    return {k: v.div_(n).to(dtypes[k]) if v.is_floating_point() else v for k, v in sums.items()}


def _accumulator(value: torch.Tensor) -> torch.Tensor:
    if not value.is_floating_point():
        return value.clone()
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    return value.detach().to(dtype=dtype, copy=True)


def save_model_file(
    path: str | os.PathLike[str],
    *,
    model_config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    vocab: Mapping[str, Any],
    step: int,
    source_checkpoints: Sequence[str],
) -> None:
    """Atomically write a ``transformer_nmt.model/1`` file (weights only, plain types)."""
    payload = {
        "format": MODEL_FILE_FORMAT,
        "model_config": dict(model_config),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in state_dict.items()},
        "vocab": dict(vocab),
        "step": int(step),
        "source_checkpoints": [str(s) for s in source_checkpoints],
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_model_file(path: str | os.PathLike[str]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load a model file (or a Lightning checkpoint) as ``(Transformer in eval mode, meta)``.

    ``meta`` holds ``model_config``, ``vocab``, ``step`` and ``source_checkpoints``.
    """
    from transformer_nmt.errors import ConfigError
    from transformer_nmt.model.config import ModelConfig
    from transformer_nmt.model.transformer import Transformer

    path = Path(path)
    payload = load_checkpoint(path)
    if "format" in payload and payload["format"] != MODEL_FILE_FORMAT:
        raise CheckpointError(
            f"{path}: unknown model file format {payload['format']!r} "
            f"(expected {MODEL_FILE_FORMAT})"
        )
    state = model_state_dict(payload, path)
    meta = checkpoint_meta(payload, path)
    meta["source_checkpoints"] = list(payload.get("source_checkpoints") or [path.name])
    try:
        config = ModelConfig.from_dict(dict(meta["model_config"]))
    except ConfigError as err:
        raise CheckpointError(f"{path}: bad model_config: {err}") from err
    vocab = meta["vocab"]
    try:
        model = Transformer(
            config,
            vocab_size=int(vocab["size"]),
            pad_id=int(vocab["pad_id"]),
        )
    except KeyError as err:
        raise CheckpointError(f"{path}: vocab record lacks {err}") from err
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{path}: weights do not fit the model config: {err}") from err
    model.eval()
    return model, meta
