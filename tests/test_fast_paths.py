"""The CPU fast paths behind one switch (transformer_nmt/fast_paths.py): each can be turned
off, and then the plain torch path runs; the config key and the CLI flag set the switch."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from transformer_nmt import fast_paths
from transformer_nmt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _switch_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv, not delenv: monkeypatch records (and restores) a variable that was absent only
    # when it sets it; the tests' set_fast_paths calls must not reach the tests after them
    monkeypatch.setenv(fast_paths.ENV, "on")


def test_the_switch_reads_on_off_and_lists_and_names_an_unknown_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert all(fast_paths.enabled(name) for name in fast_paths.FAST_PATHS)  # the default
    assert fast_paths.describe() == "all on"
    assert fast_paths.set_fast_paths(False) == frozenset()
    assert not any(fast_paths.enabled(name) for name in fast_paths.FAST_PATHS)
    assert fast_paths.describe() == "all off"
    fast_paths.set_fast_paths("row_topk, dropout_mask")
    on = {name for name in fast_paths.FAST_PATHS if fast_paths.enabled(name)}
    assert on == {"row_topk", "dropout_mask"}
    assert fast_paths.describe() == "on: dropout_mask, row_topk"
    with pytest.raises(ConfigError, match="unknown fast path.*dropout_masks"):
        fast_paths.set_fast_paths("dropout_masks")
    assert fast_paths.describe() == "on: dropout_mask, row_topk"  # a bad value changed nothing


def test_dropout_with_its_fast_path_off_is_torch_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_nmt.model.dropout import Dropout

    x = torch.randn(6, 50, 16)
    dropout = Dropout(0.3).train()
    fast_paths.set_fast_paths("off")
    torch.manual_seed(7)
    off = dropout(x)
    torch.manual_seed(7)
    assert torch.equal(off, F.dropout(x, 0.3, training=True))
    fast_paths.set_fast_paths("on")
    torch.manual_seed(7)
    assert not torch.equal(dropout(x), off)  # the fast path's own draw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_dropout_fast_path_keeps_one_byte_per_element_for_backward(dtype) -> None:
    from transformer_nmt.model.dropout import Dropout, rounded_p

    x = torch.randn(4, 33, 8, dtype=dtype, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = Dropout(0.25).train()(x)
    assert [(t.dtype, t.shape) for t in saved] == [(torch.uint8, x.shape)]
    keep = saved[0].bool()
    scale = 1 / (1 - rounded_p(0.25))
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    assert torch.equal(out[keep], (x.detach()[keep] * scale).to(dtype))
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, (keep.to(dtype) * scale).to(dtype))


def test_attention_in_bf16_on_a_cpu_takes_sdpa_with_its_fast_path_off() -> None:
    from transformer_nmt.model import attention

    q = torch.randn(2, 4, 5, 8, dtype=torch.bfloat16)
    assert attention._explicit_product(q)
    fast_paths.set_fast_paths("off")
    assert not attention._explicit_product(q)
    assert not attention._explicit_product(q.float())  # fp32 takes SDPA either way


def test_beam_search_with_its_fast_path_off_uses_torch_topk_and_finds_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.test_search import IDS, make_model, sources
    from transformer_nmt.search import beam_search, topk

    model, src = make_model(300, eos_bias=1.0), sources(300)
    kwargs = {"beam_size": 3, "nbest": 2, "max_len_b": 6, **IDS}
    monkeypatch.setattr(topk, "ROW_TOPK_BLOCK", 8)  # 37 blocks: the block path runs
    fast = beam_search(model, src, **kwargs)

    def not_called(*args, **kwargs):
        raise AssertionError("row_topk ran with its fast path off")

    monkeypatch.setattr(topk, "row_topk", not_called)
    fast_paths.set_fast_paths("allocator,dropout_mask,explicit_attention")
    plain = beam_search(model, src, **kwargs)
    for a, b in zip(fast, plain, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == [h.score for h in b]


def test_the_allocator_is_left_alone_with_its_fast_path_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformer_nmt import cpu_memory

    def no_c_library(*args, **kwargs):
        raise AssertionError("mallopt was looked up")

    monkeypatch.setattr(cpu_memory.ctypes, "CDLL", no_c_library)
    fast_paths.set_fast_paths("off")
    assert "allocator fast path is off" in cpu_memory.keep_freed_memory()
    assert cpu_memory.release_freed_memory() is False


def test_the_config_key_sets_the_jobs_switch_and_names_a_bad_path() -> None:
    from transformer_nmt.experiments import validated_pipeline

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    assert validated_pipeline(config, "c.yaml").cpu_fast_paths() == "on"
    for value, switch in ((False, "off"), ("row_topk,allocator", "row_topk,allocator")):
        pipeline = validated_pipeline({**config, "cpu_fast_paths": value}, "c.yaml")
        assert pipeline.cpu_fast_paths() == switch
    bad = r"^c\.yaml: config: cpu_fast_paths: unknown fast path.*topk"
    with pytest.raises(ConfigError, match=bad):
        validated_pipeline({**config, "cpu_fast_paths": "topk"}, "c.yaml")


def test_the_cli_flag_sets_the_switch_for_the_process_and_its_children() -> None:
    from transformer_nmt.cli.arguments import add_fast_path_arguments, apply_fast_paths

    parser = argparse.ArgumentParser()
    add_fast_path_arguments(parser)
    assert apply_fast_paths(parser.parse_args([])) == "all on"
    assert apply_fast_paths(parser.parse_args(["--cpu-fast-paths", "off"])) == "all off"
    import os

    assert os.environ[fast_paths.ENV] == "off"  # what DDP ranks and workers inherit
    with pytest.raises(ConfigError, match="unknown fast path"):
        apply_fast_paths(parser.parse_args(["--cpu-fast-paths", "fast"]))


def test_the_benchmark_leaves_out_exactly_the_path_each_variant_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as when run as a script
    path = REPO / "benchmarks" / "bench_fast_paths.py"
    spec = importlib.util.spec_from_file_location("bench_fast_paths", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    variants = bench.variants()
    assert fast_paths.parse(variants["all on"]) == frozenset(fast_paths.FAST_PATHS)
    assert fast_paths.parse(variants["all off"]) == frozenset()
    for name in fast_paths.FAST_PATHS:
        assert fast_paths.parse(variants[f"all but {name}"]) == set(fast_paths.FAST_PATHS) - {name}
    assert len(variants) == 2 + len(fast_paths.FAST_PATHS)
