"""The hardware a run plans for: GPU kinds (memory, bf16), this machine's CPU and RAM, the
device a process trains on, and the training speeds recorded per model and device kind.

The recorded speeds are data, not code: ``recorded_throughput.yaml`` beside this module (each
entry's model, device, tokens/s, precision, machine, date and source); ``RECORDED_THROUGHPUT``
is read from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from transformer_nmt.errors import ConfigError

GIB = 1024**3


@dataclass(frozen=True)
class GpuKind:
    """A GPU model: its memory (GiB, as sold) and whether it computes in bf16 (``precision:
    auto`` picks bf16-mixed there and 16-mixed elsewhere, as ``rules.resolve_precision``
    does on the device)."""

    memory_gib: float
    bf16: bool


# The one home of known GPU memory sizes (vendors' data sheets). "a100" and "v100" without a
# size mean the smaller card: a plan must not promise what the smaller variant cannot hold.
GPU_KINDS: dict[str, GpuKind] = {
    "h100": GpuKind(80, bf16=True),
    "h200": GpuKind(141, bf16=True),
    "a100-40": GpuKind(40, bf16=True),
    "a100-80": GpuKind(80, bf16=True),
    "a100": GpuKind(40, bf16=True),
    "v100-16": GpuKind(16, bf16=False),
    "v100-32": GpuKind(32, bf16=False),
    "v100": GpuKind(16, bf16=False),
}

# Fraction of a device's memory a step may use: the rest is for the CUDA context, the caching
# allocator's fragmentation and validation/search buffers (on a CPU: the data loader, MLflow).
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Throughput:
    """Target tokens/s of one device training a preset, and where the number comes from;
    ``precision``: the one it was measured in (None: whatever the plan uses), a plan in another
    precision does not use it."""

    tgt_tokens_per_s: float
    source: str
    precision: str | None = None


RECORDED_THROUGHPUT_FILE = Path(__file__).with_name("recorded_throughput.yaml")


def load_recorded_throughput(
    path: Path = RECORDED_THROUGHPUT_FILE,
) -> dict[tuple[str, str], Throughput]:
    """(model, device kind) -> Throughput, from the recorded-speeds file (each entry's
    ``devices`` lists the kinds it holds for); ConfigError naming the file and entry."""
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))["recorded"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise ConfigError(f"{path}: cannot read the recorded throughputs ({err})") from err
    table: dict[tuple[str, str], Throughput] = {}
    required = ("model", "devices", "tokens_per_s", "machine", "date", "source")
    for i, entry in enumerate(entries):
        missing = [key for key in required if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise ConfigError(f"{path}: recorded[{i}]: missing key(s) {missing}")
        source = f"{entry['source']} ({entry['machine']}, {entry['date']})"
        for kind in entry["devices"]:
            table[(str(entry["model"]), str(kind))] = Throughput(
                float(entry["tokens_per_s"]), source, entry.get("precision")
            )
    return table


# Training throughputs per (model, device kind): target tokens per second of one device (a
# model reshaped from its preset by model_overrides is keyed "preset (field value, ...)").
RECORDED_THROUGHPUT = load_recorded_throughput()


@dataclass(frozen=True)
class Target:
    """Where the plan runs: ``kind`` ("cpu" or a ``GPU_KINDS`` name), devices per node and the
    memory of one device (bytes; None: unknown)."""

    kind: str
    devices: int
    memory_bytes: int | None
    memory_source: str


def gpu_target(kind: str, devices: int) -> Target:
    """A ``GPU_KINDS`` GPU; an unknown kind is a ConfigError listing the known ones."""
    key = kind.lower()
    if key not in GPU_KINDS:
        raise ConfigError(f"--gpu-kind: unknown GPU kind {kind!r}; known: {', '.join(GPU_KINDS)}")
    if devices <= 0:
        raise ConfigError(f"--gpus must be a positive integer, got {devices}")
    spec = GPU_KINDS[key]
    return Target(key, devices, int(spec.memory_gib * GIB), f"{key}: {spec.memory_gib:g} GiB")


def available_ram_bytes() -> int:
    """This machine's available memory (``MemAvailable`` of /proc/meminfo; else free pages)."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def total_ram_bytes() -> int:
    """This machine's memory (``MemTotal``): unlike the available RAM, the same in every process
    of a run, so that ``max_tokens: auto`` chooses one size for all of them."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_target(processes: int = 1, ram: int | None = None) -> Target:
    """This machine's CPU: ``processes`` training processes sharing its RAM (``ram`` bytes;
    default: the available RAM now)."""
    what = "available RAM" if ram is None else "RAM"
    ram = (available_ram_bytes() if ram is None else ram) // processes
    share = f" / {processes} processes" if processes > 1 else ""
    return Target("cpu", processes, ram, f"this machine's {what}{share} ({ram / GIB:.1f} GiB)")


def this_device(
    accelerator: str, device_index: int, processes: int, cpu_ram: int | None = None
) -> tuple[torch.device | None, Target]:
    """This process's device: the CUDA device ``device_index`` when training on a GPU, else the
    CPU with ``cpu_ram`` bytes (None: the available RAM) shared by ``processes``."""
    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        device = torch.device("cuda", device_index)
        total = torch.cuda.get_device_properties(device).total_memory
        return device, Target("cuda", processes, total, f"{torch.cuda.get_device_name(device)}")
    return None, cpu_target(processes, cpu_ram)
