"""CTranslate2 export and decoding (optional: ``pip install 'transformer_nmt[ct2]'``).

``export_ct2`` converts a model file (``averaged.pt``) into a CTranslate2 model directory with
CTranslate2's own spec API (``TransformerSpec`` of a ``TransformerEncoderSpec`` and a
``TransformerDecoderSpec``, validated, optimised and saved as its converters do):

- post-LN (``pre_norm=False``, no final norms) or pre-LN (``norm_first``: final LayerNorms);
- the embedding matrix (shared or not) scaled by sqrt(d_model); the pre-softmax projection is
  the same matrix when tied (CTranslate2 stores identical arrays once);
- positions: our own table is written explicitly (our sinusoids interleave sin/cos, where
  CTranslate2's built-in ones concatenate them), ``max_positions`` rows for sinusoids, the
  learned tables (row E) as they are;
- attention: W_q, W_k, W_v fused (self-attention) or W_q and [W_k; W_v] (cross-attention), W_o,
  with their biases when ``attention_bias``; FFN with ReLU and biases; LayerNorm eps ``ln_eps``;
- the vocabulary: the SentencePiece pieces by id (pad 0, unk 1, ``<s>`` 2, ``</s>`` 3); the
  source gets ``</s>`` appended (``add_source_eos``: training saw ``x EOS``) and decoding starts
  from ``<s>`` (``decoder_start_token``): the same tokens as our own search.

``transformer_nmt.json`` beside CTranslate2's files records the model config, the step, the
table length and the vocabulary identity (``vocab.sha256``), so that ``Ct2Translator`` refuses
another SentencePiece model as ``translator.Translator`` does.

Decoding differences from ``search.beam_search`` (documented, not hidden):
- length penalty: CTranslate2 divides log P(Y | X) by |Y|^α; ours is GNMT's ((5 + |Y|) / 6)^α.
  Both are monotonic in |Y| for α > 0, but they trade length against probability differently,
  so beam search with α > 0 can rank finished hypotheses differently (rarely, in practice);
  greedy search (beam 1) does not use it and gives the same tokens;
- maximum length: CTranslate2's ``max_decoding_length`` is one number per batch: here the
  longest source of the batch (``x EOS`` tokens) + ``max_len_b`` tokens; longer outputs of the
  batch's shorter sentences are then cut to their own source length + ``max_len_b`` tokens, the
  cap of our search (which then forces EOS, where CTranslate2 stops without one; the score of a
  cut hypothesis is that of the uncut one);
- CTranslate2's beam search stops when the best hypothesis has finished; ours stops when no
  live hypothesis can still beat the finished ones (exact). PAD and ``<s>`` are suppressed in
  both.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_vocab_info
from transformer_nmt.errors import CheckpointError, ConfigError, UserFacingError
from transformer_nmt.inference.engine import TranslationEngine
from transformer_nmt.runs.checkpoints import experiment_mismatch, load_model_file
from transformer_nmt.search import Hypothesis, SearchSettings

log = logging.getLogger(__name__)

META_FILE = "transformer_nmt.json"
META_FORMAT = "transformer_nmt.inference.ct2/1"
INSTALL_HINT = "install it with: pip install 'transformer_nmt[ct2]' (or: pip install ctranslate2)"
# Sinusoid rows written by default: sources + outputs up to 1024 positions.
DEFAULT_MAX_POSITIONS = 1024


def import_ctranslate2():
    """The ``ctranslate2`` module, or a UserFacingError that says how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserFacingError(f"CTranslate2 is not installed; {INSTALL_HINT}") from None
    return ctranslate2


def check_exportable(config: Mapping[str, Any]) -> None:
    """ConfigError naming the key when CTranslate2 cannot run a model of ``config``."""
    d_model, h = int(config["d_model"]), int(config["h"])
    for key in ("d_k", "d_v"):
        if int(config[key]) * h != d_model:
            raise ConfigError(
                f"model config key {key!r}={config[key]} is not supported by CTranslate2: "
                f"it needs d_k = d_v = d_model / h = {d_model / h:g}"
            )


def _array(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec, module) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


def _layer_norm(spec, module) -> None:
    spec.gamma = _array(module.weight)
    spec.beta = _array(module.bias)


def _attention(spec, attn, residual, *, self_attention: bool) -> None:
    # CTranslate2 stacks the projections as we do (model/attention.py): self-attention
    # [W^Q; W^K; W^V] in one linear layer; cross-attention W^Q, then [W^K; W^V].
    if self_attention:
        _linear(spec.linear[0], attn.w_qkv)
    else:
        _linear(spec.linear[0], attn.w_q)
        _linear(spec.linear[1], attn.w_kv)
    _linear(spec.linear[-1], attn.w_o)
    _layer_norm(spec.layer_norm, residual.norm)


def _ffn(spec, ffn, residual) -> None:
    _linear(spec.linear_0, ffn.w_1)
    _linear(spec.linear_1, ffn.w_2)
    _layer_norm(spec.layer_norm, residual.norm)


def _positions(module, rows: int) -> np.ndarray:
    """Our position table [rows, d_model] (sinusoids), or the learned one (row E) whole."""
    import torch

    from transformer_nmt.model.positional import LearnedPositions

    if isinstance(module, LearnedPositions):
        return _array(module.weight)
    return module(rows, device=torch.device("cpu"), dtype=torch.float32).numpy().copy()


def build_spec(model, pieces: Sequence[str], max_positions: int = DEFAULT_MAX_POSITIONS):
    """The ``ctranslate2.specs.TransformerSpec`` of our ``Transformer`` with vocabulary
    ``pieces`` (by id), validated."""
    ctranslate2 = import_ctranslate2()
    specs = ctranslate2.specs
    cfg = model.cfg
    check_exportable(cfg.to_dict())
    relu = specs.common_spec.Activation.RELU
    encoder = specs.TransformerEncoderSpec(cfg.N, cfg.h, pre_norm=cfg.norm_first, activation=relu)
    decoder = specs.TransformerDecoderSpec(cfg.N, cfg.h, pre_norm=cfg.norm_first, activation=relu)
    spec = specs.TransformerSpec(encoder, decoder)

    encoder.embeddings[0].weight = _array(model.src_embed.weight)
    encoder.scale_embeddings = True  # x * sqrt(d_model), §3.4
    encoder.position_encodings.encodings = _positions(model.src_pos, max_positions)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        _attention(layer_spec.self_attention, layer.self_attn, layer.res_attn, self_attention=True)
        _ffn(layer_spec.ffn, layer.ffn, layer.res_ffn)

    target = model.src_embed if model.tgt_embed is None else model.tgt_embed
    decoder.embeddings.weight = _array(target.weight)
    decoder.scale_embeddings = True
    decoder.position_encodings.encodings = _positions(model.tgt_pos, max_positions)
    decoder.projection.weight = _array(model.projection_weight)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        _attention(layer_spec.self_attention, layer.self_attn, layer.res_self, self_attention=True)
        _attention(layer_spec.attention, layer.cross_attn, layer.res_cross, self_attention=False)
        _ffn(layer_spec.ffn, layer.ffn, layer.res_ffn)
    if cfg.norm_first:
        _layer_norm(encoder.layer_norm, model.encoder_norm)
        _layer_norm(decoder.layer_norm, model.decoder_norm)

    spec.config.layer_norm_epsilon = float(cfg.ln_eps)
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]  # decoding starts with BOS, as ours
    spec.config.add_source_eos = True  # the encoder input is ``x EOS``, as in training
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.validate()
    return spec


def export_ct2(
    model_path: str | os.PathLike[str],
    spm_model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    max_positions: int = DEFAULT_MAX_POSITIONS,
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Write the CTranslate2 model directory ``out_dir`` of the model file ``model_path``.

    The directory is built beside ``out_dir`` and renamed onto it when complete. An existing
    ``out_dir`` is an error unless ``force``.
    """
    import sentencepiece as spm

    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise UserFacingError(f"{out_dir}: already exists (use --force to replace it)")
    if max_positions < 1:
        raise ConfigError(f"--max-positions must be >= 1, got {max_positions}")
    model, meta = load_model_file(model_path)
    check_exportable(meta["model_config"])
    vocab = load_vocab_info(spm_model_path)
    mismatch = experiment_mismatch(meta, model_config=None, vocab_sha256=vocab.sha256)
    if mismatch:
        raise CheckpointError(f"{model_path}: trained with {mismatch} ({spm_model_path})")
    sp = spm.SentencePieceProcessor(model_file=str(spm_model_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    spec = build_spec(model, pieces, max_positions)
    spec.optimize(quantization=quantization)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        spec.save(str(tmp))
        positions = model.cfg.max_positions if model.cfg.positional == "learned" else max_positions
        record = {
            "format": META_FORMAT,
            "model_config": dict(meta["model_config"]),
            "vocab": dict(meta["vocab"]),
            "step": meta.get("step"),
            "source_model": str(model_path),
            "max_positions": int(positions),
            "quantization": quantization,
        }
        (tmp / META_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_meta(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``transformer_nmt.json`` of an exported directory, or CheckpointError saying what it is."""
    model_dir = Path(model_dir)
    path = model_dir / META_FILE
    if not model_dir.is_dir() or not path.is_file():
        raise CheckpointError(
            f"{model_dir}: not a CTranslate2 model directory written by export-ct2 "
            f"(no {META_FILE}); export one with: python -m transformer_nmt export-ct2"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from err
    if (
        not isinstance(meta, dict)
        or meta.get("format") != META_FORMAT
        or not isinstance(meta.get("vocab"), Mapping)
    ):
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"{path}: unknown format {found!r} (expected {META_FORMAT})")
    return meta


class Ct2Translator(TranslationEngine):
    """The ``TranslationEngine`` interface on a CTranslate2 model directory."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        spm_model_path: str | os.PathLike[str],
        settings: SearchSettings,
        device: str = "auto",
        threads: int | None = None,
        *,
        compute_type: str = "default",
        inter_threads: int | None = None,
    ) -> None:
        """``threads``: intra-op threads per batch; ``inter_threads``: batches run at once, each
        on ``threads`` threads (CTranslate2's parallel.md). Neither given: on a CPU, torch's
        thread count as that many one-thread workers (CTranslate2's fastest split of two threads
        over a test set's batches: 1.3x one two-thread worker in float32, 1.6x in int8, on a
        2-core EPYC; benchmarks/records/ct2_best_epyc.json), elsewhere one worker.
        ``compute_type``: CTranslate2's (``default`` = the export's weights, or e.g.
        ``int8_float32``, which it converts to when loading)."""
        import sentencepiece as spm

        ctranslate2 = import_ctranslate2()
        self.settings = settings
        self.meta = read_meta(model_dir)
        vocab = load_vocab_info(spm_model_path)
        mismatch = experiment_mismatch(self.meta, model_config=None, vocab_sha256=vocab.sha256)
        if mismatch:
            raise CheckpointError(f"{model_dir}: exported with {mismatch} ({spm_model_path})")
        self.sp = spm.SentencePieceProcessor(model_file=str(spm_model_path))
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        kind, _, index = device.partition(":")
        if threads is None:
            import torch

            budget = torch.get_num_threads()  # the torch engine's threads
            if inter_threads is None and kind == "cpu":
                threads, inter_threads = 1, budget
            else:
                threads = budget
        self.device = device
        self.translator = ctranslate2.Translator(
            str(model_dir), device=kind, device_index=int(index or 0), intra_threads=threads,
            inter_threads=inter_threads or 1, compute_type=compute_type,
        )  # fmt: skip
        # The positions (sinusoid rows or learned ones) must cover the source ``x EOS`` and the
        # decoder inputs ``BOS y`` of up to longest source + max_len_b tokens.
        self.max_src_tokens = int(self.meta["max_positions"]) - settings.max_len_b - 1
        if self.max_src_tokens < 1:
            raise ConfigError(
                f"--max-len-b {settings.max_len_b} leaves no room for the source within "
                f"the exported max_positions={self.meta['max_positions']}"
            )
        self.truncated = 0
        self._ids = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}
        self._suppress = [[self.sp.id_to_piece(PAD_ID)], [self.sp.id_to_piece(BOS_ID)]]

    def encode(self, line: str) -> list[str]:
        """Source pieces (CTranslate2 appends ``</s>``), truncated to the positions."""
        pieces = self.sp.encode(line, out_type=str)
        if len(pieces) > self.max_src_tokens:
            self.truncated += 1
            pieces = pieces[: self.max_src_tokens]
        return pieces

    def decode(self, tokens: Sequence[int]) -> str:
        return self.sp.decode(list(tokens))

    def search(self, sources: Sequence[list[str]]) -> list[list[Hypothesis]]:
        """Decode one batch of piece lists; per sentence its n-best, best first. ``score`` is
        CTranslate2's (log P(Y | X) / |Y|^α); ``log_prob`` is not returned (NaN)."""
        return next(self.search_batches([sources]))

    def search_batches(
        self, batches: Sequence[Sequence[list[str]]]
    ) -> Iterator[list[list[Hypothesis]]]:
        """Every batch submitted at once (asynchronous), so that ``inter_threads`` workers run
        them in parallel; each batch keeps its own length cap. Results in order."""
        s = self.settings
        pending = []
        for sources in batches:
            longest = max(len(p) for p in sources) + 1  # x EOS
            pending.append(self.translator.translate_batch(
                list(sources), beam_size=s.beam, length_penalty=s.alpha, num_hypotheses=s.nbest,
                max_decoding_length=longest + s.max_len_b, min_decoding_length=0,
                max_input_length=0, return_scores=True, suppress_sequences=self._suppress,
                asynchronous=True,
            ))  # fmt: skip
        for sources, results in zip(batches, pending, strict=True):
            # Each sentence's own cap, as ours: its source length + max_len_b tokens.
            caps = [len(p) + 1 + s.max_len_b for p in sources]
            yield [
                [
                    Hypothesis([self._ids[p] for p in pieces[:cap]], float(score), float("nan"))
                    for pieces, score in zip(r.hypotheses, r.scores, strict=True)
                ]
                for r, cap in zip((a.result() for a in results), caps, strict=True)
            ]
