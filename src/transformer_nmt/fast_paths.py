"""The CPU fast paths: where this project departs, for speed on a CPU, from what torch does by
default, and the one switch that turns them off to compare (config ``cpu_fast_paths``, CLI
``--cpu-fast-paths``, environment ``TRANSFORMER_NMT_CPU_FAST_PATHS``).

Each gives the same results as the plain path: exactly (``row_topk``'s values, the allocator),
up to rounding (the explicit attention product; ``projected_loss``'s sums by chunks;
``parallel_batches``, whose one-thread GEMMs may round differently from multi-threaded ones),
or in distribution (the dropout mask, a different draw of the same Bernoulli mask). Each one's
measured gain and the command behind it are in config/README.md's departures table.

- ``allocator``: glibc's malloc keeps freed blocks for reuse (``cpu_memory.keep_freed_memory``),
  and a training run hands the free pages back every 200 updates (``release_freed_memory``).
- ``dropout_mask``: §5.4's dropout draws its mask as 16-bit integers, four per 64-bit draw,
  instead of one float per element (``model.dropout.Dropout``).
- ``explicit_attention``: eq. 1 as written, softmax in float32, instead of SDPA on a CPU in
  bf16/fp16 (``model.attention``).
- ``projected_loss``: training in fp32 or bf16-mixed (bf16 products, as autocast's) computes
  §3.4's pre-softmax projection and §5.4's loss together, by chunks of rows, with the gradient
  in the same pass, instead of [tokens x V] logits and their gradient
  (``training.objective.loss_path``).
- ``row_topk``: beam search's per-row top-k by blocks of columns (``search.topk.row_topk``).
- ``parallel_batches``: the torch engine decodes as many batches at once as torch has threads,
  each on one thread, instead of one batch at a time on all of them
  (``inference.translator.Translator.search_batches``).

The switch is the process's environment, so that the processes a run starts (DDP ranks,
DataLoader workers) follow it: ``on`` (the default), ``off``, or a comma-separated list of the
paths to keep on (the others off).
"""

from __future__ import annotations

import functools
import os

from transformer_nmt.errors import ConfigError

ENV = "TRANSFORMER_NMT_CPU_FAST_PATHS"
FAST_PATHS = (
    "allocator",
    "dropout_mask",
    "explicit_attention",
    "projected_loss",
    "row_topk",
    "parallel_batches",
)


@functools.lru_cache(maxsize=16)
def parse(value: str) -> frozenset[str]:
    """The fast paths that ``value`` (``on``, ``off``, or a comma-separated list) keeps on;
    a ConfigError names an unknown one."""
    text = value.strip().lower()
    if text in ("on", "true", "1", ""):
        return frozenset(FAST_PATHS)
    if text in ("off", "false", "0", "none"):
        return frozenset()
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(FAST_PATHS))
    if unknown:
        raise ConfigError(
            f"cpu_fast_paths: unknown fast path(s) {', '.join(unknown)} (known: "
            f"{', '.join(FAST_PATHS)}; or on / off)"
        )
    return frozenset(names)


def enabled(name: str) -> bool:
    """Whether the fast path ``name`` is on in this process."""
    return name in parse(os.environ.get(ENV, "on"))


def switch_text(value: str | bool) -> str:
    """``value`` (a config's boolean or string, a flag's string) as the switch's text, checked:
    a ConfigError names an unknown path."""
    text = ("on" if value else "off") if isinstance(value, bool) else str(value)
    parse(text)
    return text


def set_fast_paths(value: str | bool) -> frozenset[str]:
    """Set the switch for this process and the processes it starts; returns the paths on."""
    text = switch_text(value)  # a bad value raises before anything changes
    os.environ[ENV] = text
    return parse(text)


def describe() -> str:
    """The switch as the logs and MLflow give it: ``all on``, ``all off`` or the list."""
    on = parse(os.environ.get(ENV, "on"))
    if on == frozenset(FAST_PATHS):
        return "all on"
    if not on:
        return "all off"
    return "on: " + ", ".join(name for name in FAST_PATHS if name in on)
