"""Recipe fidelity: the effective settings of each WMT14 recipe beside the paper's values.

``PAPER`` is the paper's column of the table (Vaswani et al. 2017), one entry per recipe in
``RECIPES``; ``effective_settings`` resolves a recipe the way the pipeline does (the config read
and validated as the Snakefile reads it, ``transformer_nmt.experiments.load_pipeline``; the model
from its preset and ``model_overrides``, ``model_config_from_spec``; the train keys as the train
stage reads them, ``TrainConfig.from_dict``; the average and translate stages' flags parsed by
their own CLI parsers; ``max_tokens: auto`` sized as ``plan`` sizes it). One test row per
(recipe, setting); a recipe that departs from the paper fails its row unless the departure is
in ``DEPARTURES``, which names where it is documented and pins the departing value.
"""

from __future__ import annotations

import functools
import importlib
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

# The table's columns: one recipe per system of the paper's Table 2.
RECIPES = ("wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big")

# Steps at which the §5.3 learning rate is compared (warmup, its peak, decay, the last steps).
LR_STEPS = (1, 400, 4000, 40_000, 100_000, 300_000)

# GPU setups whose per-update batch is computed (``max_tokens: auto`` depends on the GPUs):
# the recipes' one GPU (``resources: {gpu: 1}``) and the paper's eight (the SLURM profile's).
GPU_SETUPS = {"1xh100": ("h100", 1), "8xh100": ("h100", 8)}


def same(value: Any) -> tuple[Any, Any, Any, Any]:
    """One value for all four systems."""
    return (value, value, value, value)


def by_size(base: Any, big: Any) -> tuple[Any, Any, Any, Any]:
    """Base and big values, for EN-DE and EN-FR alike (``RECIPES`` order)."""
    return (base, big, base, big)


def by_pair(en_de: Any, en_fr: Any) -> tuple[Any, Any, Any, Any]:
    return (en_de, en_de, en_fr, en_fr)


def paper_lrate(d_model: int, warmup: int = 4000) -> tuple[float, ...]:
    """§5.3 eq. (3), written out here (not the package's ``paper_lr``): the rate at ``LR_STEPS``."""
    return tuple(d_model**-0.5 * min(s**-0.5, s * warmup**-1.5) for s in LR_STEPS)


def gnmt_length_penalty(alpha: float) -> tuple[float, ...]:
    """§6.1 length penalty of Wu et al. (2016): ((5 + |Y|) / 6)^alpha at |Y| = 1, 10, 50."""
    return tuple(((5 + n) / 6) ** alpha for n in (1, 10, 50))


# fmt: off
PAPER: dict[str, tuple[Any, Any, Any, Any]] = {
    # setting                     (en-de base, en-de big, en-fr base, en-fr big)   paper
    # --- architecture (§3, Table 3)
    "norm_first":                 same(False),              # §3.1 post-LN: LN(x + Sublayer(x))
    "N":                          same(6),                  # §3.1
    "d_model":                    by_size(512, 1024),       # §3.1, Table 3
    "d_ff":                       by_size(2048, 4096),      # §3.3, Table 3
    "h":                          by_size(8, 16),           # §3.2.2, Table 3
    "d_k":                        same(64),                 # §3.2.2, Table 3
    "d_v":                        same(64),                 # §3.2.2, Table 3
    "p_drop":                     (0.1, 0.3, 0.1, 0.1),     # §5.4, Table 3; §6.1: EN-FR big 0.1
    "p_drop_attn":                same(0.0),                # §5.4 names no attention dropout
    "p_drop_relu":                same(0.0),                # §5.4 names no ReLU dropout
    "eps_ls":                     same(0.1),                # §5.4 label smoothing
    "attention_bias":             same(False),              # §3.2.2 W^Q, W^K, W^V, W^O matrices
    "positional":                 same("sinusoidal"),       # §3.5
    "tie_embeddings":             same(True),               # §3.4
    "distinct_embedding_matrices": same(1),                 # §3.4 src, tgt, pre-softmax shared
    "embedding_scale":            by_size(pytest.approx(math.sqrt(512)),
                                          pytest.approx(math.sqrt(1024))),  # §3.4 sqrt(d_model)
    # --- optimizer (§5.3)
    "adam_beta1":                 same(0.9),
    "adam_beta2":                 same(0.98),
    "adam_eps":                   same(1e-9),
    "warmup":                     same(4000),
    "lr_scale":                   same(1.0),
    "lr_cooldown_steps":          same(None),               # eq. (3) to the end
    "lrate":                      by_size(pytest.approx(paper_lrate(512), rel=1e-9),
                                          pytest.approx(paper_lrate(1024), rel=1e-9)),
    "clip_grad_norm":             same(None),               # the paper clips nothing
    # --- batches and hardware (§5.1, §5.2)
    "tokens_per_update":          same(pytest.approx(25_000, rel=0.05)),  # target tokens
    # upper bound of both sides' tokens (padding included): max_tokens x GPUs x accumulation
    "update_tokens_1xh100":       same(pytest.approx(25_000, rel=0.05)),
    "update_tokens_8xh100":       same(pytest.approx(25_000, rel=0.05)),
    "src_tokens_per_update":      same(pytest.approx(25_000, rel=0.05)),  # source tokens
    "precision_h100":             same("32-true"),          # §5.2 P100s (fp32; docs/departures.md)
    # --- training (§5.2)
    "max_steps":                  by_size(100_000, 300_000),
    # --- checkpoint averaging (§6.1)
    "checkpoint_interval":        same(("minutes", 10)),
    "averaged_checkpoints":       by_size(5, 20),
    # --- beam search (§6.1)
    "beam":                       same(4),
    "alpha":                      same(0.6),
    "length_penalty":             same(pytest.approx(gnmt_length_penalty(0.6), rel=1e-9)),
    "max_len_b":                  same(50),                 # max output length = input + 50
    "early_stop":                 same("exact"),            # "terminate early when possible" [31]
    "quantize":                   same("none"),             # decodes with the trained weights
    "test_sets":                  same(["newstest2014"]),   # Table 2
    # --- vocabulary (§5.1)
    "vocab_size":                 by_pair(37_000, 32_000),  # EN-DE ~37000 BPE; EN-FR 32000 wp
    "vocab_type":                 by_pair("bpe", "wordpiece"),
}
# fmt: on


@dataclass(frozen=True)
class Departure:
    """A documented departure: the value the recipes have instead of the paper's, and where it
    is documented: (file, quoted text) pairs, each checked to hold the text (whitespace
    collapsed). The row checks that value, so a further change still fails."""

    value: Any
    documented: tuple[tuple[str, str], ...]

    def where(self) -> str:
        return "; ".join(f"{path}: '{quote}'" for path, quote in self.documented)


def _every_recipe(setting: str, departure: Departure) -> dict[tuple[str, str], Departure]:
    return {(recipe, setting): departure for recipe in RECIPES}


DEPARTURES: dict[tuple[str, str], Departure] = {
    # bf16 mixed precision on GPUs that have it (the paper trained on P100s, in fp32).
    **{
        (recipe, "precision_h100"): Departure(
            "bf16-mixed",
            (
                (
                    "docs/departures.md",
                    "`train.precision: auto` — bf16-mixed on GPUs that support it",
                ),
                (
                    f"config/experiments/{recipe}.yaml",
                    "precision: auto # bf16-mixed on GPUs with bf16 (the paper: fp32 on P100s)",
                ),
                (
                    "src/transformer_nmt/training/config.py",
                    '"auto" = bf16-mixed on GPUs with bf16 (a speed departure',
                ),
            ),
        )
        for recipe in RECIPES
    },
    # SentencePiece BPE for both pairs, with the paper's sizes.
    **_every_recipe(
        "vocab_type",
        Departure(
            "sentencepiece-bpe",
            (
                (
                    "docs/departures.md",
                    "Vocabulary: SentencePiece BPE (joint per pair) in place of the "
                    "paper's byte-pair encoding (EN-DE) and word-piece vocabulary (EN-FR)",
                ),
            ),
        ),
    ),
    # The update is sized by its real target tokens alone; its source tokens follow the data
    # (logged as train/src_tokens_per_update), under the same padded bound as the target's
    # (max_tokens bounds rows x max(source width, target width)).
    **_every_recipe(
        "src_tokens_per_update",
        Departure(
            None,
            (
                ("docs/departures.md", "`train.tokens_per_update` counts *real* target tokens"),
                (
                    "docs/departures.md",
                    "the real source and target tokens of every update are logged",
                ),
            ),
        ),
    ),
}


# --- the recipes' effective settings ----------------------------------------------------------


def _stage_args(stage: str, words: list[str]) -> Any:
    """``python -m transformer_nmt <stage> <words>`` parsed as ``cli.main`` parses it."""
    from transformer_nmt.cli import build_parser, stage_module

    parser, stage_parsers = build_parser()
    importlib.import_module(stage_module(stage)).configure(stage_parsers[stage])
    return parser.parse_args([stage, *words])


@functools.cache
def _vocab_type() -> str:
    """The kind of vocabulary the spm_train stage trains (no recipe key chooses it), read from
    a model that ``train_spm`` trains on a small corpus."""
    import tempfile

    from sentencepiece import sentencepiece_model_pb2

    from transformer_nmt.data.spm import train_spm

    rng = random.Random(1)
    words = ["the", "house", "is", "small", "das", "Haus", "ist", "klein", "la", "maison"]
    with tempfile.TemporaryDirectory() as tmp:
        inputs = [Path(tmp, name) for name in ("train.src", "train.tgt")]
        for path in inputs:
            lines = (" ".join(rng.choices(words, k=8)) for _ in range(200))
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        train_spm(
            inputs, Path(tmp, "spm"), vocab_size=300, sample_sentences=400, seed=1, num_threads=1
        )
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(Path(tmp, "spm.model").read_bytes())
    kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(model.trainer_spec.model_type)
    return f"sentencepiece-{kind.lower()}"


@functools.cache
def effective_settings(recipe: str) -> dict[str, Any]:
    """Every ``PAPER`` setting of ``recipe`` as the pipeline's stages would get it."""
    from transformer_nmt.cli.arguments import search_settings
    from transformer_nmt.experiments import load_pipeline
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.model.transformer import shape_model
    from transformer_nmt.search.length_penalty import length_penalty
    from transformer_nmt.training import hardware, preflight
    from transformer_nmt.training.config import TrainConfig
    from transformer_nmt.training.optimizer import PaperSchedule

    pipeline = load_pipeline(REPO_ROOT / "config" / "experiments" / f"{recipe}.yaml")
    (name,) = pipeline.experiments()
    exp = pipeline.experiment(name)
    spec = pipeline.train_config(name)  # what the train stage reads (train_config.json)
    model_cfg = model_config_from_spec(spec["model"])
    train_cfg = TrainConfig.from_dict(spec["train"])
    vocab_size = pipeline.data_settings(exp["dataset"], exp["pair"])["vocab_size"]

    model = shape_model(model_cfg, vocab_size)
    softmax = model.out_proj.weight if model.out_proj is not None else model.src_embed.weight
    matrices = {id(w) for w in (model.src_embed.weight, model._target_embedding().weight, softmax)}

    schedule = PaperSchedule(
        model_cfg.d_model, train_cfg.warmup, train_cfg.lr_scale,
        train_cfg.lr_cooldown_steps, train_cfg.max_steps,
    )  # fmt: skip

    def plan(setup: str) -> Any:
        kind, gpus = GPU_SETUPS[setup]
        target = hardware.gpu_target(kind, gpus)
        return preflight.plan_experiment(
            name, exp["preset"], model_cfg, train_cfg, vocab_size, target
        )

    plans = {setup: plan(setup) for setup in GPU_SETUPS}

    dummy = ["--model", "m.pt", "--spm-model", "spm.model"]
    translate = _stage_args("translate", [*dummy, *pipeline.translate_flags(name).split()])
    search = search_settings(translate)
    average = _stage_args(
        "average",
        ["--checkpoint-dir", "ckpt", "--out", "avg.pt", *pipeline.average_flags(name).split()],
    )

    settings = {key: getattr(model_cfg, key) for key in (
        "norm_first", "N", "d_model", "d_ff", "h", "d_k", "d_v", "p_drop", "p_drop_attn",
        "p_drop_relu", "eps_ls", "attention_bias", "positional", "tie_embeddings",
    )}  # fmt: skip
    settings |= {
        "distinct_embedding_matrices": len(matrices),
        "embedding_scale": model.embed_scale,
        "adam_beta1": train_cfg.adam_betas[0],
        "adam_beta2": train_cfg.adam_betas[1],
        "adam_eps": train_cfg.adam_eps,
        "warmup": train_cfg.warmup,
        "lr_scale": train_cfg.lr_scale,
        "lr_cooldown_steps": train_cfg.lr_cooldown_steps,
        "lrate": tuple(schedule(step - 1) for step in LR_STEPS),  # LambdaLR epoch = step - 1
        "clip_grad_norm": train_cfg.clip_grad_norm,
        "tokens_per_update": train_cfg.tokens_per_update,
        **{f"update_tokens_{setup}": p.update_tokens for setup, p in plans.items()},
        "src_tokens_per_update": None,  # no setting: the data decides (see DEPARTURES)
        "precision_h100": plans["1xh100"].precision,
        "max_steps": train_cfg.max_steps,
        "checkpoint_interval": (
            ("minutes", train_cfg.checkpoint_every_minutes)
            if train_cfg.checkpoint_every_steps is None
            else ("steps", train_cfg.checkpoint_every_steps)
        ),
        "averaged_checkpoints": int(average.last) if average.last != "auto" else "auto",
        "beam": search.beam,
        "alpha": search.alpha,
        "length_penalty": tuple(length_penalty(n, search.alpha) for n in (1, 10, 50)),
        "max_len_b": search.max_len_b,
        "early_stop": search.early_stop,
        "quantize": translate.quantize or "none",
        "test_sets": exp["test_sets"],
        "vocab_size": vocab_size,
        "vocab_type": _vocab_type(),
    }
    return settings


# --- the table ----------------------------------------------------------------------------------


def test_the_table_covers_every_recipe_and_setting() -> None:
    recipes = {p.stem for p in (REPO_ROOT / "config" / "experiments").glob("wmt14_*.yaml")}
    assert recipes == set(RECIPES)
    assert all(len(column) == len(RECIPES) for column in PAPER.values())
    for recipe in RECIPES:
        assert set(effective_settings(recipe)) == set(PAPER), recipe
    assert set(DEPARTURES) <= {(r, s) for r in RECIPES for s in PAPER}


@pytest.mark.parametrize("setting", sorted({setting for _, setting in DEPARTURES}))
def test_every_departure_is_documented_where_it_says(setting: str) -> None:
    for (recipe, row), departure in DEPARTURES.items():
        if row != setting:
            continue
        for path, quote in departure.documented:
            text = " ".join((REPO_ROOT / path).read_text(encoding="utf-8").split())
            assert " ".join(quote.split()) in text, (
                f"{recipe}: {setting}: {path} no longer documents the departure: {quote!r}"
            )


@pytest.mark.parametrize(
    ("recipe", "setting"),
    [pytest.param(r, s, id=f"{r}-{s}") for r in RECIPES for s in PAPER],
)
def test_recipe_setting_matches_the_paper(recipe: str, setting: str) -> None:
    paper = PAPER[setting][RECIPES.index(recipe)]
    effective = effective_settings(recipe)[setting]
    departure = DEPARTURES.get((recipe, setting))
    if departure is None:
        assert effective == paper, (
            f"{recipe}: {setting} is {effective!r}, the paper's is {paper!r} "
            f"(document the departure and add it to DEPARTURES, or restore the paper's value)"
        )
        return
    assert effective == departure.value, (
        f"{recipe}: {setting} is {effective!r}, the paper's is {paper!r}; its documented "
        f"departure is {departure.value!r} ({departure.where()})"
    )
    assert effective != paper, (
        f"{recipe}: {setting} is the paper's {paper!r} again: drop its DEPARTURES entry"
    )
