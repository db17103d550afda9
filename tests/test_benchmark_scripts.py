"""The benchmark scripts run: every script's ``--help``, the smallest real run of those that take
seconds, and their harness (``benchmarks/harness.py``), whose stage command lines are the
pipeline's own: each equals what ``snakemake -n -p`` prints for the rule that runs the stage."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, checkout_pythonpath, snakemake_command

BENCHMARKS = REPO_ROOT / "benchmarks"
# the modules the scripts import; every other benchmarks/*.py is a script with a command line
LIBRARIES = {"harness", "record_claims"}
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.stem not in LIBRARIES)
DEMO = REPO_ROOT / "config" / "config.yaml"

# Every script's --help in one interpreter (torch imported once, not once per script): each runs
# as `python benchmarks/X.py --help` runs it, benchmarks/ first on sys.path.
HELP = """
import contextlib, io, json, runpy, sys
results = {}
for path in sys.argv[1:]:
    sys.argv, out = [path, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
        status = "ran to its end"
    except SystemExit as end:
        status = end.code or 0
    except BaseException as err:
        status = repr(err)
    results[path] = [status, out.getvalue()[-3000:]]
print(json.dumps(results))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": checkout_pythonpath(), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    paths = [str(BENCHMARKS / name) for name in SCRIPTS]
    code = f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})\n{HELP}"
    proc = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {Path(path).name: result for path, result in json.loads(proc.stdout).items()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(helps: dict[str, list], script: str) -> None:
    status, output = helps[script]
    assert status == 0 and "usage:" in output, output


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=_env(), timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_bench_training_one_tiny_step(tmp_path: Path) -> None:
    out = tmp_path / "training.json"
    _run("benchmarks/bench_training.py", "--presets", "tiny", "--steps", "1", "--threads", "1",
         "--cpu-max-tokens", "256", "--out", str(out))  # fmt: skip
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert (row["preset"], row["precision"]) == ("tiny", "fp32") and row["tgt_tokens_per_s"] > 0
    assert payload["meta"]["machine"]["cores"] >= 1


def test_bench_ab_compares_bench_decoding_on_two_trees(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    _run("benchmarks/bench_ab.py", "--a", "src", "--b", "src", "--repeats", "1",
         "--metric", "sentences_per_s", "--key", "preset", "search", "--out", str(out), "--",
         "benchmarks/bench_decoding.py", "--quick", "--repeats", "1", "--cache-only")  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert {(r["key"]["preset"], r["key"]["search"]) for r in rows} == {
        ("tiny", "greedy"), ("tiny", "beam4")}  # fmt: skip
    assert all(r["a_median"] > 0 and r["b_median"] > 0 for r in rows)


def test_bench_quantize_bleu_on_its_toy_model(tmp_path: Path) -> None:
    out = tmp_path / "quantize.json"
    _run("benchmarks/bench_quantize_bleu.py", "--updates", "5", "--sentences", "8",
         "--threads", "1", "--out", str(out))  # fmt: skip
    assert out.stat().st_size > 0


def test_bench_ct2_decoding_on_synthetic_weights(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2.json"
    _run("benchmarks/bench_ct2_decoding.py", "--sentences", "4", "--runs", "1", "--threads", "1",
         "--out", str(out))  # fmt: skip
    assert out.stat().st_size > 0


def test_bench_quick_lists_the_long_comparisons() -> None:
    output = _run("benchmarks/bench_quick.py", "--list").stdout
    assert "bench_time_to_bleu.py" in output and "lever_screen.py" in output


def test_no_script_but_the_harness_starts_a_stage() -> None:
    """A stage's command line has one home, the harness: a script that started ``python -m
    transformer_nmt`` itself would copy a rule of the Snakefile."""
    starters = [name for name in SCRIPTS if '"-m", "transformer_nmt"' in
                (BENCHMARKS / name).read_text(encoding="utf-8")]  # fmt: skip
    assert starters == []


# --- the harness ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import harness

        yield harness
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The demo's shell commands as ``snakemake -n -p`` prints them in an empty directory: the
    words of each stage's command (the job's environment and redirections left out)."""
    workdir = tmp_path_factory.mktemp("dry_run")
    proc = subprocess.run(
        [*snakemake_command(), "-n", "-p", "--cores", "2", "--snakefile",
         str(REPO_ROOT / "Snakefile"), "--directory", str(workdir)],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = {}
    for line in proc.stdout.splitlines():
        if "python -m transformer_nmt " in line:
            words = shlex.split(line[line.index("python -m transformer_nmt ") :])
            words = words[: next((i for i, w in enumerate(words) if w in {">", ">>", "3>&2"}))]
            commands.setdefault(words[3], words)
    return commands


def _options(words: list[str]) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for word in words:
        if word.startswith("--"):
            options[word] = []
        elif options:
            options[list(options)[-1]].append(word)
    return options


def _without(words: list[str], *options: str) -> list[str]:
    """``words`` less each of ``options`` and its values."""
    kept, skipping = [], False
    for word in words:
        if word.startswith("--"):
            skipping = word in options
        if not skipping:
            kept.append(word)
    return kept


def test_the_train_command_is_the_train_rules(harness, dry_run, tmp_path, monkeypatch) -> None:
    """What the benchmarks train is what Snakemake trains: the same command line, word for
    word, and the same settings in its config file."""
    from transformer_nmt.experiments.paths import RUN_DIR

    monkeypatch.chdir(tmp_path)
    exp = harness.load_experiment(DEMO)
    run_dir = Path(RUN_DIR.format(experiment=exp.name))
    cmd = harness.train_command(exp, run_dir, tracking=True)
    assert cmd[0] == sys.executable and ["python", *cmd[1:]] == dry_run["train"]
    written = json.loads((tmp_path / exp.train_config_file).read_text())
    assert written == exp.pipeline.train_config(exp.name)  # what the train_config rule writes
    assert "--mlflow-experiment" not in harness.train_command(exp, tmp_path / "run")


def test_the_data_stage_commands_are_the_data_rules(harness, dry_run) -> None:
    for stage, build in {
        "download": lambda o: harness.download_command(*o["--registry"], *o["--dataset"],
                                                       *o["--out-dir"]),
        "prepare": lambda o: harness.prepare_command(
            *o["--registry"], *o["--dataset"], *o["--pair"], *o["--raw-dir"], *o["--out-dir"],
            int(*o["--workers"]), *o["--clean"]),
        "spm-train": lambda o: harness.spm_train_command(
            o["--inputs"], int(*o["--vocab-size"]), int(*o["--sample-sentences"]),
            int(*o["--seed"]), *o["--model-prefix"]),
        "encode": lambda o: harness.encode_command(*o["--spm-model"], o["--inputs"],
                                                   *o["--out-dir"], int(*o["--workers"])),
    }.items():  # fmt: skip
        rule = dry_run[stage]
        assert build(_options(rule[4:]))[1:] == rule[1:], stage


def test_the_translate_and_score_commands_are_the_rules_less_tracking(harness, dry_run) -> None:
    """The rules' flags less MLflow's, and translate decodes as trained (no ``--quantize``)."""
    exp = harness.load_experiment(DEMO)
    tracking = ("--mlflow-experiment", "--mlflow-run", "--mlflow-run-dir")
    rule = _options(dry_run["translate"][4:])
    cmd = harness.translate_command(exp, *rule["--model"], *rule["--input"], *rule["--output"])
    assert cmd[1:] == _without(dry_run["translate"], *tracking, "--quantize")[1:]
    rule = _options(dry_run["score"][4:])
    cmd = harness.score_command(exp, *rule["--hyp"], *rule["--ref"], *rule["--out"])
    assert cmd[1:] == _without(dry_run["score"], *tracking)[1:]


def test_an_experiment_is_validated_with_a_benchmarks_changes(harness, tmp_path) -> None:
    """A setting the pipeline does not know fails at once, named; a seeded experiment is its
    first seed's run."""
    with pytest.raises(SystemExit, match="max_stepz"):
        harness.load_experiment(DEMO, edit=lambda e: {**e, "train": {**e["train"], "max_stepz": 1}})
    config = yaml.safe_load(DEMO.read_text())
    config["experiments"]["multi30k_en_de_tiny"]["seeds"] = [3, 4]
    seeded = tmp_path / "seeded.yaml"
    seeded.write_text(yaml.safe_dump(config))
    exp = harness.load_experiment(seeded)
    assert exp.name == "multi30k_en_de_tiny.seed3"
    assert exp.train_config(max_steps=7)["train"]["seed"] == 3


def test_a_record_round_trips_and_keeps_its_claims(harness, tmp_path) -> None:
    from record_claims import REQUIRED, load_records

    info = {"cpu": "AMD EPYC", "flags": ["avx2", "avx512_bf16"], "cores": 2, "commit": "abc1234",
            "gpu": None}  # fmt: skip
    result = {"what": "w", "values": {"x_seconds": 1.5}, "derived": {"x": ["x_seconds", "/", 60]},
              "command": "c", "runs": 3, "spread": "s", "model": {"m": "not kept"},
              "extra": [1, 2]}  # fmt: skip
    harness.write_record("demo_x", result, info, "src", tmp_path)
    record = load_records(tmp_path)["demo_x"]
    assert set(record) >= REQUIRED and "model" not in record and record["extra"] == [1, 2]
    assert record["machine"] == {"cpu_model": "AMD EPYC", "cpu_flags": "avx2 avx512_bf16",
                                 "cores": 2}  # fmt: skip
    assert (record["values"], record["commit"], record["claims"]) == ({"x_seconds": 1.5},
                                                                      "abc1234", {})  # fmt: skip
    claims = {"README.md": ["takes {x:.2f} minutes"]}
    (tmp_path / "demo_x.json").write_text(json.dumps({**record, "claims": claims}))
    harness.write_record("demo_x", {**result, "values": {"x_seconds": 3.0}}, info, "src", tmp_path)
    assert load_records(tmp_path)["demo_x"]["claims"] == claims
    assert load_records(tmp_path)["demo_x"]["values"] == {"x_seconds": 3.0}


def test_the_machine_is_the_packages_cpu_class_in_the_kernels_flags(harness) -> None:
    from transformer_nmt.training.rules import cpu_bf16_support

    info = harness.machine()
    assert info["cpu_bf16"] == cpu_bf16_support()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = set(cpuinfo.read_text().split())
        assert set(info["flags"]) <= flags
        assert {"avx2", "avx512f"} & flags <= set(info["flags"])
    tier = {"amx": "_amx", "avx512_bf16": ""}.get(info["cpu_bf16"])
    if tier is not None:
        assert harness.machine_key(info).endswith(tier) and "avx512_bf16" in info["flags"]


@pytest.mark.slow
def test_gpu_multi30k_script_runs_each_step_in_its_dry_mode(
    tmp_path: Path, shared_mirror: Path
) -> None:
    """benchmarks/gpu_multi30k.sh with GPU_MULTI30K_DRY=1: its three steps on the CPU, tiny (a
    slice of Multi30k, one seed here), each writing what the GPU run will write under OUT."""
    out = tmp_path / "out"
    env = {**_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GPU_MULTI30K_DRY": "1", "GPU_MULTI30K_DIR": str(tmp_path / "dag"),
           "GPU_MULTI30K_MIRROR": str(shared_mirror), "OUT": str(out), "SEEDS": "1"}  # fmt: skip
    proc = subprocess.run(["bash", str(BENCHMARKS / "gpu_multi30k.sh")], capture_output=True,
                          text=True, cwd=REPO_ROOT, env=env, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    steps = dict(line.split()[:2] for line in proc.stdout.splitlines()[-4:])
    assert steps == {"dag": "rc=0", "b_data": "rc=0", "b_fused_loss": "rc=0",
                     "c_tests_gpu": "rc=0"}, proc.stdout[-3000:]  # fmt: skip
    multi30k = json.loads((out / "multi30k.json").read_text())
    assert multi30k["recipe"] == "config/experiments/multi30k_en_de_base.yaml"
    assert multi30k["complete"] and multi30k["seeds"] == ["1"] and multi30k["dag_seconds"] > 0
    (run,) = multi30k["runs"].values()
    assert set(run["test"]) == {"test_2016_flickr", "test_2017_flickr"}
    assert run["dev_bleu_chosen"] is not None and multi30k["goal"]["met"] is False
    rows = json.loads((out / "fused_loss.json").read_text())["rows"]
    assert [row["settings"]["train.fused_loss"] for row in rows] == ["auto", False]
    assert all(row["tgt_tokens_per_s"] > 0 and row["loss_path"] for row in rows)
    assert all(row["cuda_peak_allocated_gib"] is None for row in rows)  # no CUDA here
    tests = (out / "tests_gpu.log").read_text()
    assert " skipped" in tests and "failed" not in tests and " passed" not in tests
    assert {p.name for p in out.iterdir()} == {"multi30k.json", "fused_loss.json",
                                               "tests_gpu.log", "run.log", "dag.tgz"}  # fmt: skip
