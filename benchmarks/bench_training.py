"""Training throughput: target tokens/s of forward + backward + optimizer step (§5.1-5.3).

Synthetic batches of realistic shape (token-bounded, as the batch sampler builds them): every
batch holds ``max_tokens // L`` sentence pairs of length L on each side. The step is the one
``TranslationModule`` runs: Transformer forward, label-smoothed loss (§5.4) per target token,
backward, Adam (§5.3) and the LR schedule.

On CPU: fp32, presets ``tiny`` (Multi30k-like: 8k vocabulary, L=16) and ``base`` (WMT-like: 37k
vocabulary, L=28); with ``--cpu-bf16`` also in bf16 autocast (the lever for CPUs with
AVX512-BF16 or AMX; elsewhere oneDNN emulates bf16 and it is slower). On CUDA additionally
``base`` and ``big`` in bf16 autocast, with peak memory. Every row gives the model FLOPs
utilisation:

    MFU = model FLOPs per second / peak FLOPs of the device,
    model FLOPs per step = 6 x (encoder params x source tokens + decoder params x target tokens
                                + d_model x V x target tokens [pre-softmax projection])
                           + attention 12 x (S^2 + T^2 + T x S) x h x d_k x N x B

(the 6 = 2 forward + 4 backward per multiply-add; attention scores and weighted sums counted
in full, causal masking not subtracted). GPU peak: ``--peak-tflops`` or 989 TFLOP/s for
H100/H200 SXM dense bf16. On a GPU the micro-batch is by default the one ``max_tokens: auto``
chooses there for the preset's WMT14 EN-DE recipe (``config/experiments/wmt14_en_de_<preset>``,
sized as ``plan`` and the train job size it), each row gives the estimated peak
memory of its batch shape (``memory.estimate_peak_bytes``) beside the measured one, and one
profiled step names the attention kernels SDPA ran (flash, memory-efficient, cuDNN or math).

CPU peak: no data sheet number fits a shared VM's vCPUs, so the
script measures it: the best of several timed ``torch.mm`` of 2048 x 2048 matrices in the
row's dtype with the same threads, i.e. what this machine's GEMM library reaches at best. A CPU
MFU near 100 % means the step is bound by the GEMMs' arithmetic, and no reordering of the same
FLOPs (in any toolkit) can run it much faster at that precision.

Usage: ``python benchmarks/bench_training.py [--steps 5] [--presets tiny base]``; prints a table
and writes ``benchmarks/out/training.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from harness import allocator_as_in_the_stages, machine, write_result

from transformer_nmt.model.config import ModelConfig, get_preset
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.objective import fused_loss_wanted, model_loss
from transformer_nmt.training.optimizer import FUSED_ADAM_DEVICES, build_optimizer, build_scheduler

OUT = Path(__file__).resolve().parent / "out" / "training.json"
REPO = Path(__file__).resolve().parent.parent


# preset -> (vocabulary size, sentence length L per side)
SHAPES = {"tiny": (8000, 16), "base": (37000, 28), "big": (37000, 28)}
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def model_flops_per_step(model: Transformer, batch: int, src_len: float, tgt_len: float) -> float:
    """Training FLOPs of one step (see the module docstring)."""
    cfg = model.cfg
    enc = sum(p.numel() for p in model.encoder_layers.parameters())
    dec = sum(p.numel() for p in model.decoder_layers.parameters())
    src_tokens, tgt_tokens = batch * src_len, batch * tgt_len
    dense = 6 * (enc * src_tokens + dec * tgt_tokens + cfg.d_model * model.vocab_size * tgt_tokens)
    pairs = src_len**2 + tgt_len**2 + tgt_len * src_len
    attention = 12 * pairs * cfg.h * cfg.d_k * cfg.N * batch
    return float(dense + attention)


def measure_gemm_tflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """The best TFLOP/s of an n x n x n ``torch.mm`` in ``dtype`` on the CPU (current threads)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up: packing buffers, thread pool
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def make_step(
    preset: str,
    *,
    device: str,
    bf16: bool,
    max_tokens: int,
    compile_model: bool = False,
    fused_loss: bool = False,
    sdpa_backend: str = "auto",
    length: int | None = None,
    padded: bool = False,
    cfg: ModelConfig | None = None,
    vocab: int | None = None,
) -> tuple[Callable[[], None], dict]:
    """One training step on a synthetic token-bounded batch, and the batch's shape.

    ``sdpa_backend``: auto = the kernel PyTorch's dispatcher picks for each attention call;
    otherwise SDPA is restricted to that one (``torch.nn.attention.sdpa_kernel``), for an A/B of
    the kernels on short sentences, where a tiled flash kernel computes mostly padding.
    ``length``: sentence length L per side (default: the preset's); ``padded``: each sentence's
    real length drawn uniformly from [L/2, L], the rest padding, as in a real batch (the
    padding masks route attention to the kernels that take a mask). ``cfg``, ``vocab``: another
    model (e.g. an experiment's, its overrides applied) and vocabulary size than the preset's."""
    default_vocab, default_length = SHAPES[preset]
    vocab = vocab or default_vocab
    length = length or default_length
    cfg = cfg or get_preset(preset)
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=vocab, pad_id=0).to(device).train()
    optimizer = build_optimizer(model.parameters(), fused=device in FUSED_ADAM_DEVICES or None)
    scheduler = build_scheduler(optimizer, d_model=cfg.d_model, warmup=4000)
    batch = max(1, max_tokens // length)
    src = torch.randint(4, vocab, (batch, length), device=device)
    tgt_in = torch.randint(4, vocab, (batch, length), device=device)
    tgt_out = torch.randint(4, vocab, (batch, length), device=device)
    if padded:
        for tokens in (src, tgt_out):  # pad id 0 after each sentence's drawn length
            real = torch.randint(length // 2, length + 1, (batch, 1), device=device)
            tokens.masked_fill_(torch.arange(length, device=device) >= real, 0)
        tgt_in.masked_fill_(tgt_out == 0, 0)
    forward = torch.compile(model) if compile_model else model

    batch_tensors = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}

    def step() -> None:  # the loss as the stage computes it (model_loss: its path on this device)
        with (
            torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16),
            sdpa_restricted_to(sdpa_backend),
        ):
            out = model_loss(
                model, batch_tensors, eps=cfg.eps_ls, pad_id=0, fused=fused_loss,
                forward=forward if compile_model else None,
            )  # fmt: skip
        (out.loss / out.ntokens).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    shape = {
        "model": model, "vocab": vocab, "length": length, "batch": batch,
        "src_tokens": int((src != 0).sum()), "tgt_tokens": int((tgt_out != 0).sum()),
    }  # fmt: skip
    return step, shape


SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math")


def sdpa_restricted_to(backend: str) -> contextlib.AbstractContextManager:
    """SDPA limited to one kernel (``--sdpa-backend``); auto: no restriction."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return sdpa_kernel([kernel])


def bench(
    preset: str,
    *,
    device: str,
    bf16: bool,
    max_tokens: int,
    steps: int,
    warmup_steps: int,
    peak_tflops: float | None,
    compile_model: bool = False,
    fused_loss: bool = False,
    sdpa_backend: str = "auto",
    length: int | None = None,
    padded: bool = False,
) -> dict:
    step, shape = make_step(
        preset,
        device=device,
        bf16=bf16,
        max_tokens=max_tokens,
        compile_model=compile_model,
        fused_loss=fused_loss,
        sdpa_backend=sdpa_backend,
        length=length,
        padded=padded,
    )
    model, vocab, length, batch = shape["model"], shape["vocab"], shape["length"], shape["batch"]
    src_tokens, tgt_tokens = shape["src_tokens"], shape["tgt_tokens"]
    for _ in range(warmup_steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    cpu_seconds = (time.process_time() - cpu_start) / steps  # less sensitive to other load
    row = {
        "preset": preset,
        "device": device,
        "precision": "bf16-mixed" if bf16 else "fp32",
        "compiled": compile_model,
        "fused_loss": fused_loss,
        "sdpa_backend": sdpa_backend,
        "vocab_size": vocab,
        "sentence_length": length,
        "batch_sentences": batch,
        "padded": padded,
        "tgt_tokens_per_step": tgt_tokens,
        "seconds_per_step": seconds,
        "tgt_tokens_per_s": tgt_tokens / seconds,
        "cpu_seconds_per_step": cpu_seconds,
        "tgt_tokens_per_cpu_s": tgt_tokens / cpu_seconds,
        "src_tokens_per_s": src_tokens / seconds,
        "threads": torch.get_num_threads(),
        "steps": steps,
    }
    if device == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["estimated_peak_gib"] = estimated_peak_gib(
            preset, batch, length, "bf16-mixed" if bf16 else "32-true"
        )
        row["attention"] = attention_kernels(step)
    # real (unpadded) tokens: the padding's arithmetic is not the model's work
    flops = model_flops_per_step(model, batch, src_tokens / batch, tgt_tokens / batch)
    row["model_tflops_per_s"] = flops / seconds / 1e12
    if peak_tflops:
        row["peak_tflops"] = peak_tflops
        row["mfu"] = flops / seconds / (peak_tflops * 1e12)
    return row


def recipe_auto_max_tokens(preset: str) -> tuple[int, str]:
    """``max_tokens: auto`` of the preset's WMT14 EN-DE recipe on this machine's GPU, as
    ``plan`` reads the recipe and sizes it (``cli.plan.plan_config``: the same sizing as the
    train job's ``training.run.resolve_run``), and the recipe it came from."""
    from transformer_nmt.cli.plan import plan_config

    recipe = REPO / "config" / "experiments" / f"wmt14_en_de_{preset}.yaml"
    args = argparse.Namespace(
        configfile=recipe, gpus=None, gpu_kind=None, estimate_only=True, tokens_per_s=None
    )
    (entry,) = plan_config(args)
    if not entry.plan.fits:
        raise SystemExit(f"{recipe}: max_tokens auto finds no batch that fits {entry.target}")
    return entry.plan.max_tokens, str(recipe.relative_to(REPO))


def estimated_peak_gib(preset: str, batch: int, length: int, precision: str) -> float:
    """The analytic peak memory of a ``batch`` x ``length`` step (``memory.estimate_peak_bytes``:
    what ``plan`` and ``max_tokens: auto`` rely on where nothing is measured)."""
    from transformer_nmt.training.memory import estimate_peak_bytes

    vocab, _ = SHAPES[preset]
    estimate = estimate_peak_bytes(get_preset(preset), vocab, batch, length, precision)
    return estimate.total / 2**30


ATTENTION_KERNEL_MARKS = ("flash", "fmha", "efficient_attention", "attention", "sdpa", "softmax")
# Where a step's GPU time goes, by the kernel's name (first match wins): the matrix multiplies
# carry the model's FLOPs; everything else is time MFU loses.
KERNEL_CLASSES = (
    ("loss_softmax", ("log_softmax", "logsumexp", "nll", "cross_entropy")),
    ("attention", ATTENTION_KERNEL_MARKS),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "wgmma", "matmul", "cublas")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("layer_norm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "philox", "bernoulli")),
    ("reduction", ("reduce", "sum_")),
    ("copy_cast", ("copy", "cast", "convert", "fill")),
    ("elementwise", ("elementwise", "vectorized", "triton")),
)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for label, marks in KERNEL_CLASSES:
        if any(mark in lowered for mark in marks):
            return label
    return "other"


def attention_kernels(step: Callable[[], None]) -> dict:
    """One profiled step on CUDA: the GPU time (ms) of each kernel whose name marks it as
    attention (SDPA's flash / memory-efficient / cuDNN or a math path's softmax), the step's
    total GPU time, the time per kernel class (KERNEL_CLASSES) and the 15 costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    every: dict[str, float] = {}
    classes: dict[str, float] = {}
    total = 0.0
    for event in prof.key_averages():
        ms = getattr(event, "device_time_total", None)
        ms = (ms if ms is not None else event.cuda_time_total) / 1e3
        if event.device_type.name != "CUDA":
            continue
        total += ms
        every[event.key[:160]] = round(ms, 3)
        label = kernel_class(event.key)
        classes[label] = round(classes.get(label, 0.0) + ms, 3)
        if label == "attention":
            kernels[event.key[:160]] = round(ms, 3)
    flash = any("flash" in name.lower() for name in kernels)
    top = dict(sorted(every.items(), key=lambda item: -item[1])[:15])
    return {
        "kernels_ms": kernels,
        "gpu_ms_total": round(total, 3),
        "flash_called": flash,
        "classes_ms": dict(sorted(classes.items(), key=lambda item: -item[1])),
        "top_kernels_ms": top,
    }


def fused_loss(args: argparse.Namespace, device: str) -> bool:
    """--fused-loss: on, off, or auto = train.fused_loss's default on ``device``."""
    setting = {"auto": "auto", "on": True, "off": False}[args.fused_loss]
    return fused_loss_wanted(setting, torch.device(device))


def detect_peak_tflops() -> float | None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"], help="CPU presets")
    parser.add_argument("--gpu-presets", nargs="+", default=["base", "big"])
    parser.add_argument("--cpu-max-tokens", type=int, default=4096)
    parser.add_argument(
        "--gpu-max-tokens",
        default="auto",
        help="target tokens per GPU step; auto (default): what max_tokens: auto chooses on this "
        "GPU for the preset's WMT14 EN-DE recipe",
    )
    parser.add_argument("--steps", type=int, default=5, help="measured steps (CPU)")
    parser.add_argument("--gpu-steps", type=int, default=20)
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="GPU peak dense bf16 TFLOP/s (default: 989.4 for H100/H200, 312 for A100)",
    )
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument(
        "--cpu-bf16", action="store_true", help="also run the CPU presets in bf16 autocast"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (train.compile)",
    )
    parser.add_argument(
        "--fused-loss",
        choices=("auto", "on", "off"),
        default="auto",
        help="the loss's torch.compile'd passes over the logits (train.fused_loss; auto: on CUDA)",
    )
    parser.add_argument(
        "--sdpa-backend",
        nargs="+",
        choices=SDPA_BACKENDS,
        default=["auto"],
        help="GPU rows: SDPA restricted to each of these kernels in turn (auto: PyTorch's "
        "choice); a kernel that cannot run the step is printed with its error and skipped",
    )
    parser.add_argument(
        "--gpu-length",
        type=int,
        default=None,
        help="GPU rows: sentence length L per side (default: the preset's, 28); the batch is "
        "max_tokens // L sentences",
    )
    parser.add_argument(
        "--padded",
        action="store_true",
        help="GPU rows: each sentence's real length uniform in [L/2, L], padded to L",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads on CPU; 0 = torch's default. On a loaded machine 1 thread "
        "and tgt_tokens_per_cpu_s (process CPU time) give steadier A/B ratios",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(f"memory: {allocator_as_in_the_stages()}")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]  # other processes on the machine skew CPU numbers
    rows = []
    cpu_peaks = {}
    if not args.skip_cpu:
        for bf16 in (False, True) if args.cpu_bf16 else (False,):
            dtype = torch.bfloat16 if bf16 else torch.float32
            cpu_peaks[str(dtype)] = measure_gemm_tflops(dtype)
            for preset in args.presets:
                rows.append(
                    bench(
                        preset,
                        device="cpu",
                        bf16=bf16,
                        max_tokens=args.cpu_max_tokens,
                        steps=args.steps,
                        warmup_steps=1,
                        peak_tflops=cpu_peaks[str(dtype)],
                        compile_model=args.compile,
                        fused_loss=fused_loss(args, "cpu"),
                    )
                )
    if torch.cuda.is_available():
        peak = args.peak_tflops or detect_peak_tflops()
        for preset in args.gpu_presets:
            if args.gpu_max_tokens == "auto":
                max_tokens, sized_by = recipe_auto_max_tokens(preset)
            else:
                max_tokens, sized_by = int(args.gpu_max_tokens), "--gpu-max-tokens"
            print(f"{preset}: {max_tokens} target tokens per step ({sized_by})", flush=True)
            for backend in args.sdpa_backend:
                try:
                    row = bench(
                        preset,
                        device="cuda",
                        bf16=True,
                        max_tokens=max_tokens,
                        steps=args.gpu_steps,
                        warmup_steps=3,
                        peak_tflops=peak,
                        compile_model=args.compile,
                        fused_loss=fused_loss(args, "cuda"),
                        sdpa_backend=backend,
                        length=args.gpu_length,
                        padded=args.padded,
                    )
                except RuntimeError as error:  # e.g. no kernel of that kind for these inputs
                    print(f"{preset}, SDPA {backend}: {str(error).splitlines()[0]}", flush=True)
                    torch.cuda.empty_cache()
                    continue
                rows.append(row | {"max_tokens_from": sized_by})

    header = f"{'preset':<6} {'device':<6} {'precision':<10} {'sdpa':<9} "
    header += f"{'batch':>6} "
    header += f"{'s/step':>8} {'tgt tok/s':>11} {'TFLOP/s':>8} {'peak GiB':>9} {'MFU':>6}"
    print(header)
    for r in rows:
        mem = f"{r['peak_memory_gib']:.2f}" if "peak_memory_gib" in r else "-"
        if "estimated_peak_gib" in r:
            mem += f" (est {r['estimated_peak_gib']:.2f})"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        print(
            f"{r['preset']:<6} {r['device']:<6} {r['precision']:<10} {r['sdpa_backend']:<9} "
            f"{r['tgt_tokens_per_step']:>6} {r['seconds_per_step']:>8.3f} "
            f"{r['tgt_tokens_per_s']:>11.0f} {r['model_tflops_per_s']:>8.3f} {mem:>9} {mfu:>6}"
        )
        if "attention" in r:
            att = r["attention"]
            share = sum(att["kernels_ms"].values()) / max(att["gpu_ms_total"], 1e-9)
            print(
                f"  attention kernels ({100 * share:.0f}% of the step's GPU time; flash called: "
                f"{att['flash_called']}): {', '.join(att['kernels_ms'])}"
            )
            if "classes_ms" in att:
                print(
                    "  GPU time by kernel class (ms): "
                    + ", ".join(f"{label} {ms:.1f}" for label, ms in att["classes_ms"].items())
                )
    for dtype, peak in cpu_peaks.items():
        print(
            f"CPU peak (measured {dtype} GEMM, 2048^3, {torch.get_num_threads()} threads): "
            f"{peak:.4g} TFLOP/s"
        )
    out = args.out
    info = machine()
    meta = {
        "torch": torch.__version__,
        "machine": info,
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "gpu": info["gpu"],
        "cpu_peak_tflops_measured": cpu_peaks,
        "cpu_flags_bf16": info["cpu_bf16"] not in ("none", "unknown"),
    }
    write_result(out, {"meta": meta, "rows": rows})
    print(f"1-min load average before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
