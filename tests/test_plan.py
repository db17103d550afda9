"""``plan``: the pre-flight table of every config, its accumulation and its
refusals; the memory estimate against measurements; the train stage's own check."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO_ROOT
from tests.training_helpers import train_argv
from transformer_nmt.cli import main
from transformer_nmt.cli.plan import free_disk_bytes as REAL_FREE_DISK_BYTES
from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig, apply_overrides, get_preset
from transformer_nmt.model.transformer import Transformer, count_parameters_of
from transformer_nmt.training import hardware, memory
from transformer_nmt.training import preflight as pf
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.loss_kernels import GPU_LOSS_ROWS
from transformer_nmt.training.objective import label_smoothed_cross_entropy
from transformer_nmt.training.optimizer import build_optimizer

# the starter config for a user's own corpus names files the user brings: tests/test_local_data.py
RECIPES = sorted(
    p for p in (REPO_ROOT / "config" / "experiments").glob("*.yaml") if p.stem != "own_data_example"
)
CONFIGS = [REPO_ROOT / "config" / "config.yaml", *RECIPES]
RECIPE = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_base.yaml"
SMALL = ModelConfig(N=2, d_model=64, d_ff=256, h=4, d_k=16, d_v=16)


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by experiment name: ``{name: [cells...]}``."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("| experiment "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_plan_prints_a_row_per_experiment_of_every_config(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _plan(capsys, "--configfile", str(config), "--estimate-only")
    assert code == 0, err
    settings = yaml.safe_load(config.read_text())
    experiments = settings["experiments"]
    expected = set(experiments)
    if "table3" in settings:  # one experiment <base>.<row> per Table 3 row, the base's batch
        base = settings["table3"]["base"]
        expected |= {f"{base}.{row}" for row in settings["table3"]["rows"]}
        for row, seeds in settings["table3"].get("seeds", {}).items():  # a run per seed
            name = base if row == "base" else f"{base}.{row}"
            expected = (expected - {name}) | {f"{name}.seed{s}" for s in seeds}
    rows = _rows(out)
    assert set(rows) == expected
    for name, cells in rows.items():
        exp = experiments[name.split(".")[0]]
        if name in experiments:  # a Table 3 row may change the model (row "big")
            assert cells[1].startswith(exp["preset"] + " (")
        if exp["train"]["max_tokens"] == "auto":  # sized to the device: a whole step's worth
            assert cells[3].startswith("auto: ") and "auto: the largest max_tokens" in out
            chosen = int(cells[3].removeprefix("auto: ").replace(",", ""))
            assert chosen > 0 and chosen % memory.AUTO_STEP == 0
        else:
            assert cells[3] == f"{exp['train']['max_tokens']:,}"
        assert cells[9] == "yes"
        peak = cells[7]
        assert peak.endswith("estimated") and float(peak.split()[0]) > 0
    if all(exp["train"]["accelerator"] == "cpu" for exp in experiments.values()):
        assert "benchmarks/log/" in out  # CPU recipes: a recorded speed, its source


@pytest.mark.parametrize(
    # By hand: 25,000 tokens per update / 3,125 per batch = 8 batches, spread over the GPUs
    # (round(25000 / (3125 * gpus))); 3 GPUs: round(2.67) = 3 -> 28,125 tokens.
    ("gpus", "accumulation", "update"),
    [(1, 8, "25,000"), (2, 4, "25,000"), (3, 3, "28,125"), (8, 1, "25,000")],
)
def test_wmt14_base_accumulation_by_hand(
    gpus: int,
    accumulation: int,
    update: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(RECIPE.read_text())
    config["experiments"]["wmt14_en_de_base"]["train"]["max_tokens"] = 3125  # the paper's share
    path = tmp_path / "p100_share.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = _plan(
        capsys, "--configfile", str(path), "--gpus", str(gpus), "--gpu-kind", "h100",
        "--estimate-only", "--tokens-per-s", "100000",
    )  # fmt: skip
    assert code == 0
    cells = _rows(out)["wmt14_en_de_base"]
    assert cells[4] == f"{update} (25,000)"
    assert cells[5] == f"{gpus} h100 x {accumulation}"
    assert cells[2] == "bf16-mixed"  # precision auto on a bf16 GPU
    tokens = int(update.replace(",", ""))
    steps_per_hour = 100_000 * gpus * 3600 / tokens
    assert cells[10] == f"{steps_per_hour:,.0f}"
    assert cells[11] == f"{100_000 / steps_per_hour:,.1f}"  # max_steps 100k
    assert cells[12] == f"{100_000 / steps_per_hour * gpus:,.1f}"


@pytest.mark.parametrize(
    ("gpus", "kind", "preset"),
    [(1, "h100", "base"), (8, "h100", "base"), (1, "v100", "big"), (8, "a100", "base")],
)
def test_max_tokens_auto_fills_the_memory_or_the_devices_share_of_an_update(
    gpus: int, kind: str, preset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The WMT recipes' ``max_tokens: auto``: the largest size (in AUTO_STEP steps) whose
    estimated worst batch fits AUTO_MARGIN of the usable memory, at most the device's share of
    25,000 tokens; accumulation fills the rest of the §5.1 update."""
    recipe = REPO_ROOT / "config" / "experiments" / f"wmt14_en_de_{preset}.yaml"
    name = f"wmt14_en_de_{preset}"
    code, out, _ = _plan(
        capsys, "--configfile", str(recipe), "--gpus", str(gpus), "--gpu-kind", kind,
        "--estimate-only",
    )  # fmt: skip
    assert code == 0
    cells = _rows(out)[name]
    chosen = int(cells[3].removeprefix("auto: ").replace(",", ""))
    share = -(-25_000 // gpus)
    experiment = yaml.safe_load(recipe.read_text())["experiments"][name]
    train = TrainConfig.from_dict(experiment["train"])
    model = apply_overrides(get_preset(preset), experiment.get("model_overrides") or {})
    budget = (
        hardware.GPU_KINDS[kind].memory_gib
        * hardware.GIB
        * hardware.USABLE_FRACTION
        * memory.AUTO_MARGIN
    )

    def peak(max_tokens: int) -> int:
        cfg = dataclasses.replace(train, max_tokens=max_tokens)
        return memory.worst_batch(model, cfg, 37000, cells[2])[2].total

    assert chosen % memory.AUTO_STEP == 0 and chosen <= share and peak(chosen) <= budget
    # nothing larger would do: the next step overshoots the share or the memory
    assert chosen + memory.AUTO_STEP > share or peak(chosen + memory.AUTO_STEP) > budget
    assert cells[9] == "yes"
    accumulation = max(1, round(25_000 / (chosen * gpus)))
    assert cells[5] == f"{gpus} {kind} x {accumulation}"
    if kind == "v100":  # big on 16 GiB: memory decides, fp16 (no bf16 on a V100)
        assert chosen + memory.AUTO_STEP <= share and cells[2] == "16-mixed"


def test_max_tokens_auto_in_the_train_job_sizes_to_the_memory_it_is_given(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a CPU with a memory budget (a machine of 64 MiB, faked): the job sizes max_tokens to
    it, logs the choice, trains with it and records it in the summary."""
    import json
    import logging

    from tests.training_helpers import MODEL
    from transformer_nmt.data.vocab import load_vocab_info
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.training import resolution

    ram = 64 * 2**20
    monkeypatch.setattr(resolution, "total_ram_bytes", lambda: ram)
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    argv = train_argv(corpus, run, max_steps=2, max_tokens="auto", tokens_per_update=100_000)
    assert main(argv) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    chosen = summary["train_config"]["max_tokens"]
    vocab = load_vocab_info(corpus["spm"]).size
    model_cfg = model_config_from_spec(MODEL)
    expected = memory.auto_max_tokens(
        model_cfg, TrainConfig(tokens_per_update=100_000), vocab, "32-true", ram, 1
    )
    assert chosen == expected and 0 < chosen < 100_000  # the memory decided, not the share
    assert f"max_tokens: auto -> {chosen} tokens per micro-batch (limited by the memory)" in (
        caplog.text
    )
    assert "precision: 32-true (auto on this CPU: " in caplog.text  # which, and why
    budget = ram * hardware.USABLE_FRACTION * memory.AUTO_MARGIN
    cfg = TrainConfig(max_tokens=chosen, tokens_per_update=100_000)
    assert memory.worst_batch(model_cfg, cfg, vocab, "32-true")[2].total <= budget


def test_max_tokens_must_be_a_positive_integer_or_auto() -> None:
    assert TrainConfig.from_dict({"max_tokens": "auto"}).max_tokens == "auto"
    for bad in ("big", 0, True, 2.5):
        with pytest.raises(ConfigError, match="'max_tokens' must be a positive integer or 'auto'"):
            TrainConfig.from_dict({"max_tokens": bad})


def test_cpu_hours_come_from_the_recorded_throughput_of_the_models_own_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = REPO_ROOT / "config" / "experiments" / "multi30k_en_de_cpu.yaml"
    config = yaml.safe_load(recipe.read_text())
    exp = config["experiments"]["multi30k_en_de_cpu"]
    # fp32 on every CPU: without its bf16 sizing, precision auto resolves to 32-true
    exp["train"].pop("by_precision", None)
    steps, tokens = exp["train"]["max_steps"], exp["train"]["tokens_per_update"]

    def hours(overrides: dict) -> tuple[str, str]:
        exp["model_overrides"] = {"norm_first": True, **overrides}
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(config))
        code, out, _ = _plan(capsys, "--configfile", str(path))
        assert code == 0
        cells = _rows(out)["multi30k_en_de_cpu"]
        assert cells[5] == "1 cpu x 1" and cells[2] == "32-true"
        return cells[11], out

    # the recipe narrows tiny (d_model 128): its own recorded speed, not tiny's
    narrow = {"d_model": 128, "d_ff": 512, "d_k": 32, "d_v": 32}
    rate = hardware.RECORDED_THROUGHPUT[("tiny (d_model 128, d_ff 512, d_k 32, d_v 32)", "cpu")]
    cell, out = hours(narrow)
    assert cell == f"{steps * tokens / rate.tgt_tokens_per_s / 3600:,.1f}"
    assert "speed of tiny (d_model 128, d_ff 512, d_k 32, d_v 32) on cpu: 5,473" in out
    # tiny's own shape: tiny's recorded speed
    rate = hardware.RECORDED_THROUGHPUT[("tiny", "cpu")]
    assert hours({})[0] == f"{steps * tokens / rate.tgt_tokens_per_s / 3600:,.1f}"
    # a shape nobody measured: the nearest recorded model's speed scaled by parameter count
    wide = {"d_model": 192, "d_k": 48, "d_v": 48}
    cell, out = hours(wide)
    vocab = config["data"]["multi30k"]["en-de"]["vocab_size"]
    params = count_parameters_of(apply_overrides(get_preset("tiny"), wide), vocab)
    scaled = pf.scaled_throughput(params, vocab, "cpu", "32-true")
    narrow_params = count_parameters_of(apply_overrides(get_preset("tiny"), narrow), vocab)
    tiny_params = count_parameters_of(get_preset("tiny"), vocab)
    nearest = min((narrow_params, 5473), (tiny_params, 3183),
                  key=lambda p: abs(math.log(p[0] / params)))  # fmt: skip
    assert scaled.tgt_tokens_per_s == pytest.approx(nearest[1] * nearest[0] / params)
    assert cell == f"{steps * tokens / scaled.tgt_tokens_per_s / 3600:,.1f}"
    assert "speed of tiny (d_model 192, d_k 48, d_v 48) on cpu: " in out
    assert "by its parameter count" in out
    # where nothing is recorded for the device kind in that precision (a V100 has fp16 records
    # only): no hours, and the note says why
    assert pf.scaled_throughput(params, vocab, "v100", "bf16-mixed") is None


def test_a_worst_batch_too_big_for_a_v100_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load(RECIPE.read_text())
    config["experiments"]["wmt14_en_de_base"]["train"]["max_tokens"] = 200_000
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = _plan(
        capsys, "--configfile", str(path), "--gpu-kind", "v100", "--estimate-only"
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: experiments.wmt14_en_de_base.train.max_tokens: ")
    assert "14.4 GiB usable" in lines[0]  # 90 % of a 16 GiB V100
    assert _rows(out)["wmt14_en_de_base"][9] == "NO"
    # the advised max_tokens does fit (and one more token a little over does not matter)
    advised = int(lines[0].split("at most ~")[1].split()[0])
    assert 3_125 <= advised < 200_000
    train = TrainConfig.from_dict(config["experiments"]["wmt14_en_de_base"]["train"])
    fitting = dataclasses.replace(train, max_tokens=advised)
    target = hardware.gpu_target("v100", 1)
    assert pf.plan_experiment("x", "base", ModelConfig(), fitting, 37000, target).fits


def test_unknown_gpu_kind_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _plan(capsys, "--configfile", str(RECIPE), "--gpu-kind", "p100")
    assert code == 2 and out == ""
    assert (
        err.strip()
        == f"error: --gpu-kind: unknown GPU kind 'p100'; known: {', '.join(hardware.GPU_KINDS)}"
    )


def test_an_invalid_config_is_refused_as_the_snakefile_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load(RECIPE.read_text())
    config["experiments"]["wmt14_en_de_base"]["train"]["max_tokens"] = "many"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    code, _, err = _plan(capsys, "--configfile", str(path))
    assert code == 2
    assert err.count("\n") == 1 and "experiments.wmt14_en_de_base.train.max_tokens" in err


# --- the estimate against measurements ---------------------------------------------------------


def test_weights_gradients_and_adam_states_are_counted_exactly(one_torch_thread) -> None:
    vocab = 500
    model = Transformer(SMALL, vocab_size=vocab)
    optimizer = build_optimizer(model.parameters())
    src = torch.randint(4, vocab, (2, 7))
    label_smoothed_cross_entropy(model(src, src), src).loss.backward()
    optimizer.step()  # creates Adam's moments; the gradients stay
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    for state in optimizer.state.values():
        tensors += [state["exp_avg"], state["exp_avg_sq"]]
    real = sum(t.numel() * t.element_size() for t in tensors)
    est = memory.estimate_peak_bytes(SMALL, vocab, 2, 7, "32-true")
    assert est.weights_and_optimizer == real
    assert count_parameters_of(SMALL, vocab) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "cfg",
    [SMALL, ModelConfig(N=1, d_model=32, d_ff=64, h=2, d_k=8, d_v=24, norm_first=True)],
    ids=["post-LN", "pre-LN"],
)
def test_activation_estimate_matches_the_tensors_saved_for_backward(cfg, one_torch_thread) -> None:
    """What autograd really keeps for backward (distinct storages of the saved tensors, the
    log-probabilities included) against the estimate's activations + one [tokens x vocab]."""
    vocab, batch, width = 300, 4, 24
    model = Transformer(cfg, vocab_size=vocab).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    src, tgt = torch.randint(4, vocab, (batch, width)), torch.randint(4, vocab, (batch, width))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        label_smoothed_cross_entropy(model(src, tgt), tgt)
    est = memory.estimate_peak_bytes(cfg, vocab, batch, width, "32-true")
    ratio = (est.activations + batch * width * vocab * 4) / sum(saved.values())
    assert 0.8 <= ratio <= 1.5, ratio  # the estimate adds backward's per-layer gradients


def test_a_named_gpu_kind_is_never_measured_on_this_machines_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a machine with a GPU, ``--gpu-kind v100`` plans a V100 from its data sheet and
    recorded speed: measuring the local GPU (an H200, say) would give the V100 plan the H200's
    peak and speed. Without --gpu-kind the local GPU is measured."""
    from transformer_nmt.cli import plan

    measured_on: list[object] = []

    def plan_experiment(*args: object, measure_on: object = None, **kwargs: object) -> object:
        measured_on.append(measure_on)
        return real(*args, **kwargs)

    real = pf.plan_experiment
    monkeypatch.setattr(plan, "_local_gpu", lambda: "the local GPU")
    monkeypatch.setattr(plan.pf, "plan_experiment", plan_experiment)
    code, out, _ = _plan(capsys, "--configfile", str(RECIPE), "--gpu-kind", "v100")
    assert code == 0 and measured_on == [None] and "estimated" in out
    monkeypatch.setattr(
        plan.torch.cuda,
        "get_device_properties",
        lambda d: type("P", (), {"total_memory": 80 * hardware.GIB, "major": 9, "minor": 0}),
    )
    monkeypatch.setattr(plan.torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    measured_on.clear()
    _plan(capsys, "--configfile", str(RECIPE))
    assert measured_on == ["the local GPU"]


@pytest.mark.parametrize(
    ("dtype", "precision"), [(torch.float32, "32-true"), (torch.bfloat16, "bf16-mixed")]
)
def test_loss_estimate_is_the_logits_the_loss_keeps_their_gradient_and_its_buffer(
    dtype: torch.dtype, precision: str
) -> None:
    """The loss keeps only the logits for backward (in their own dtype: no float32
    log-probabilities) and writes their gradient once; the estimate's loss term is those two
    and the float32 chunk buffer. On an H200 the former count (four float32 copies) put base's
    estimate at 1.95x its measured peak (benchmarks/records/gpu_h200.json)."""
    vocab, tokens = 300, 64
    logits = torch.randn(1, tokens, vocab, dtype=dtype, requires_grad=True)
    target = torch.randint(4, vocab, (1, tokens))
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() >= tokens * vocab:  # the [tokens x vocab] tensors, not lse or targets
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = label_smoothed_cross_entropy(logits, target, eps=0.1, pad_id=0).loss
    loss.backward()
    assert logits.grad is not None
    gradient = logits.grad.numel() * logits.grad.element_size()
    buffer = min(GPU_LOSS_ROWS, tokens) * vocab * 4
    estimate = memory.estimate_peak_bytes(SMALL, vocab, 1, tokens, precision)
    assert estimate.loss == sum(saved.values()) + gradient + buffer


@pytest.mark.gpu
def test_cuda_measurement_and_estimate_agree_within_a_factor_two() -> None:
    cfg, vocab = ModelConfig(N=2, d_model=256, d_ff=1024, h=4, d_k=64, d_v=64), 8000
    for precision in ("32-true", "bf16-mixed"):
        measured = memory.measure_peak_bytes(cfg, vocab, 8, 256, precision, torch.device("cuda"))
        estimate = memory.estimate_peak_bytes(cfg, vocab, 8, 256, precision).total
        assert measured.peak_bytes > 0
        assert 0.5 <= estimate / measured.peak_bytes <= 2.0, (precision, estimate, measured)


# --- shapes and the train stage -------------------------------------------------------------


def test_worst_batch_respects_the_sampler_limits() -> None:
    train = TrainConfig(max_tokens=3125, max_positions=1024)
    rows, width, est = memory.worst_batch(ModelConfig(), train, 37000, "bf16-mixed")
    assert width <= 1024 and rows * width <= 3125 and rows >= 1
    # no allowed shape has a larger estimate
    for w in (1024, 625, 100, 1):
        other = memory.estimate_peak_bytes(ModelConfig(), 37000, 3125 // w, w, "bf16-mixed")
        assert other.total <= est.total
    # a model with few positions caps the width
    short = ModelConfig(positional="learned", max_positions=64)
    assert memory.worst_batch(short, train, 37000, "32-true")[1] <= 64


def test_train_refuses_a_batch_that_does_not_fit_the_ram_before_any_step(
    corpus: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 4 KiB free: this machine's RAM is the hardware module's to read
    monkeypatch.setattr(hardware, "available_ram_bytes", lambda: 4096)
    assert main(train_argv(corpus, tmp_path / "run", max_steps=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train.max_tokens: the worst-case batch")
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_check_fits_passes_and_reports_on_cpu() -> None:
    plan = pf.check_fits(SMALL, TrainConfig(max_tokens=256), 500, "cpu", "32-true")
    assert plan.fits and plan.peak_source == "estimated" and plan.batch * plan.width <= 256
    with pytest.raises(ConfigError, match="train.max_tokens"):
        pf.check_fits(SMALL, TrainConfig(max_tokens=10**7), 500, "cpu", "32-true")


@pytest.mark.parametrize(
    ("kind", "precision", "rate"),
    [("a100", "bf16-mixed", 82059), ("a100-80", "bf16-mixed", 82059),
     ("v100", "16-mixed", 32942), ("v100-32", "16-mixed", 39911)],
)  # fmt: skip
def test_big_on_a_published_gpu_gets_hours_with_the_source_named(
    kind: str, precision: str, rate: float, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_big.yaml"
    code, out, _ = _plan(
        capsys, "--configfile", str(recipe), "--gpus", "8", "--gpu-kind", kind, "--estimate-only"
    )
    assert code == 0
    cells = _rows(out)["wmt14_en_de_big"]
    assert cells[2] == precision  # precision auto: bf16 where the GPU has it, else fp16 AMP
    tokens = int(cells[4].split()[0].replace(",", ""))
    steps_per_hour = rate * 8 * 3600 / tokens
    assert cells[11] == f"{300_000 / steps_per_hour:,.1f}"  # the recipe's 300k steps
    assert "NVIDIA DeepLearningExamples" in out and f"{rate:,} target tokens/s" in out


def test_a_published_speed_is_not_used_for_another_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_big.yaml"
    config = yaml.safe_load(recipe.read_text())
    config["experiments"]["wmt14_en_de_big"]["train"]["precision"] = "32-true"
    path = tmp_path / "fp32.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = _plan(capsys, "--configfile", str(path), "--gpu-kind", "v100", "--estimate-only")
    assert code == 0
    assert _rows(out)["wmt14_en_de_big"][11] == "n/a"  # the V100 number is fp16 AMP's
    assert "no recorded throughput for big on v100" in out


@pytest.fixture(autouse=True)
def plenty_of_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans here do not depend on this machine's free disk (a test below sets it)."""
    from transformer_nmt.cli import plan

    monkeypatch.setattr(plan, "free_disk_bytes", lambda path: (path, 10**15))


def test_the_checkpoints_disk_is_counted_and_a_too_small_disk_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """big keeps 20 checkpoints for §6.1: 19 weights-only (P fp32 weights) and, while one is
    written, two full ones (weights and Adam's two moments: 3P): 25P floats at most, where 20
    full checkpoints took 63P while a 21st was written."""
    from transformer_nmt.cli import plan

    big = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_big.yaml"
    code, out, _ = _plan(capsys, "--configfile", str(big), "--estimate-only")
    assert code == 0
    params = count_parameters_of(get_preset("big"), 37_000)
    need = (19 + 2 * 3) * params * 4
    assert _rows(out)["wmt14_en_de_big"][13] == f"{need / hardware.GIB:.1f} GiB"
    assert need / (21 * 3 * params * 4) <= 0.40  # the goal: <= 40 % of full ones
    monkeypatch.setattr(plan, "free_disk_bytes", lambda path: (tmp_path, need - 1))
    args = ("--configfile", str(big), "--estimate-only", "--results-dir", str(tmp_path / "r"))
    code, _, err = _plan(capsys, *args)
    assert code == 2
    assert f"{tmp_path / 'r'}: {(need - 1) / hardware.GIB:.1f} GiB free" in err
    assert "lower train.keep_checkpoints" in err and len(err.strip().splitlines()) == 1


def test_free_disk_is_read_from_the_nearest_existing_directory(tmp_path: Path) -> None:
    where, free = REAL_FREE_DISK_BYTES(tmp_path / "not" / "yet")
    assert where == tmp_path and free == shutil.disk_usage(tmp_path).free


def test_recorded_throughputs_are_data_with_machine_date_and_source(tmp_path: Path) -> None:
    """The speeds plan uses live in one file; each names its machine, date and source, and a
    broken entry is an error naming the file and the entry."""
    import yaml

    entries = yaml.safe_load(hardware.RECORDED_THROUGHPUT_FILE.read_text())["recorded"]
    assert entries and all(e["machine"] and e["date"] and e["source"] for e in entries)
    assert len(hardware.RECORDED_THROUGHPUT) == sum(len(e["devices"]) for e in entries)
    big = hardware.RECORDED_THROUGHPUT[("big", "v100-32")]
    assert big.tgt_tokens_per_s == 39911 and big.precision == "16-mixed"
    assert "DGX-2 V100 32GB" in big.source
    bad = tmp_path / "recorded.yaml"
    bad.write_text(
        yaml.safe_dump({"recorded": [entries[0], {"model": "big", "devices": ["h100"]}]})
    )
    with pytest.raises(
        ConfigError,
        match=rf"{bad}: recorded\[1\]: missing key\(s\) \['tokens_per_s', 'machine', 'date'",
    ):
        hardware.load_recorded_throughput(bad)
