"""What the benchmark scripts share: the machine a figure is measured on, the JSON they write (a
script's result and the records of ``benchmarks/records/``), the process set up as the stages
set theirs, and every stage's command line.

A stage's command line is built here and only here, from the pipeline's own builders, the ones
the Snakefile's rules use: ``Pipeline.train_command`` (the train rule's ``TRAIN_COMMAND``),
``search_flags``, ``score_language_and_flags``, the output path templates. No script copies a
rule, so a renamed flag or setting fails a benchmark's tests instead of its numbers.

``benchmarks/`` is not a package: a script imports this module from its own directory (Python
puts a script's directory first on ``sys.path``); of the other modules there it imports only
``record_claims`` (the records' format). It imports nothing of the checkout at import time and
leaves ``sys.path`` alone there: ``bench_ab.py`` runs the timing scripts against another source
tree through ``PYTHONPATH``. ``load_experiment`` puts this checkout's ``src/`` first, as the
Snakefile does.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from record_claims import RECORDS

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
OUT = REPO / "benchmarks" / "out"

# --- the machine ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine a figure is measured on: the CPU model; ``flags``, the instruction sets that
    decide our CPU paths (torch's AVX2/AVX512 probes and the package's bf16 class ``cpu_bf16``,
    ``training.rules.cpu_bf16_support``), in the records' names; the cores this process
    may use; the GPU (None: none); the checkout's commit."""
    import torch

    try:
        from transformer_nmt.training.rules import cpu_bf16_support
    except ImportError:  # bench_ab.py's side A from before that function
        bf16 = "unknown"
    else:
        bf16 = cpu_bf16_support()
    probes = {"avx2": torch.cpu._is_avx2_supported, "avx512f": torch.cpu._is_avx512_supported}
    flags = [name for name, supported in probes.items() if supported()]
    flags += {"amx": ["amx_bf16", "avx512_bf16"], "avx512_bf16": ["avx512_bf16"]}.get(bf16, [])
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text(encoding="utf-8") if cpuinfo.is_file() else ""
    model = re.search(r"model name\s*:\s*(.*)", text)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": model.group(1) if model else platform.processor() or platform.machine(),
        "flags": sorted(flags),
        "cpu_bf16": bf16,
        "cores": len(os.sched_getaffinity(0)),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "commit": commit,
    }


def machine_key(info: dict[str, Any]) -> str:
    """The CPU class a figure belongs to, as the records name it: the vendor's line (xeon, epyc,
    else the model name) and what decides our CPU paths (``_amx``; nothing for AVX512-BF16;
    ``_avx512`` for AVX512 without bf16, torch's AVX512 kernels in fp32; ``_avx2``; ``_base``)."""
    model = info["cpu"].lower()
    vendor = next((v for v in ("xeon", "epyc") if v in model), None)
    vendor = vendor or re.sub(r"[^a-z0-9]+", "_", model).strip("_")[:24] or "cpu"
    tier = cpu_tier(info["flags"])
    return vendor + ("" if tier == "avx512_bf16" else f"_{tier}")


def cpu_tier(flags: Iterable[str]) -> str:
    """What decides our CPU paths, from a CPU's flags: ``amx`` (AMX-BF16), ``avx512_bf16``,
    ``avx512`` (AVX512 without bf16: torch's AVX512 kernels in fp32), ``avx2``, else ``base``."""
    flags = set(flags)
    return ("amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags
            else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags
            else "base")  # fmt: skip


# --- what a benchmark writes ------------------------------------------------------------------


def write_result(path: Path, payload: dict[str, Any]) -> None:
    """A script's result as JSON, in its keys' order (the package's atomic write: a killed run
    leaves the old one)."""
    from transformer_nmt.io_utils import atomic_open

    with atomic_open(path) as handle:
        handle.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def write_record(
    name: str, result: dict[str, Any], info: dict[str, Any], source: str,
    directory: Path | None = None,
) -> Path:  # fmt: skip
    """``result`` (what, values, derived, command, runs, spread, and any other fields but
    ``model``) as record ``name`` of ``directory`` (default ``benchmarks/records/``), measured on
    ``info`` (``machine()``), with the claims of the record already there (``record_claims``:
    the sentences of README.md and config/ that cite it)."""
    path = (directory or RECORDS) / f"{name}.json"
    old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    described = {"cpu_model": info["cpu"], "cpu_flags": " ".join(info["flags"]),
                 "cores": info["cores"]}  # fmt: skip
    if info.get("gpu"):
        described["gpu"] = info["gpu"]
    record = {
        "what": result["what"],
        "values": result["values"],
        "derived": result.get("derived", {}),
        "claims": old.get("claims", {}),
        "command": result["command"],
        "commit": info["commit"],
        "machine": described,
        "date": datetime.date.today().isoformat(),
        "runs": result["runs"],
        "spread": result["spread"],
        "source": source,
    }
    record.update({k: v for k, v in result.items() if k not in record and k != "model"})
    write_result(path, record)
    return path


# --- the process as the stages set theirs -----------------------------------------------------


def allocator_as_in_the_stages() -> str:
    """The process's allocator set as the train and translate stages set theirs
    (``cpu_memory.keep_freed_memory``), so a benchmark of their code measures what they run;
    a source tree from before that module (``bench_ab.py``'s side A) keeps the default."""
    try:
        from transformer_nmt.cpu_memory import keep_freed_memory
    except ImportError:
        return "the default allocator (a source tree without cpu_memory)"
    return keep_freed_memory()


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a measured process: ``threads`` OMP/MKL threads, this checkout's
    package, this interpreter's ``python`` first on PATH (Snakemake's jobs call ``python``)."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    return {**python_env(env), "PYTHONPATH": str(SRC)}


def python_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with this interpreter's directory first on PATH."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# --- running a measured process ---------------------------------------------------------------

# the train stage's progress line: "step 50/150 (33%)  elapsed 0m41s  eta 1m22s  loss 6.1234
# lr ...  tgt tok/s 2412"
TRAIN_LINE = re.compile(r"step (\d+)/\d+ .*?loss ([0-9.]+).*?tgt tok/s (\d+)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM of /proc/PID/status)."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) * 1024
    return 0


def run_logged(
    cmd: list[str],
    run_dir: Path,
    threads: int,
    line: re.Pattern,
    peak: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str, list[float]]:
    """Run ``cmd`` in the repository root with ``threads`` threads (``thread_env``); its
    combined output (kept in ``run_dir/train.log``) and the process's CPU seconds when each log
    line matching ``line`` appeared (polled every 0.1 s): CPU time, unlike wall time, barely
    counts the other jobs on a shared machine. ``peak``: gets the process's peak RSS
    (``"rss_bytes"``) as last polled; ``env``: more environment variables."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "train.log"
    cpu: list[float] = []
    with open(log_path, "w", encoding="utf-8") as handle:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env={**thread_env(threads), **(env or {})}, stdout=handle,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        while proc.poll() is None:
            time.sleep(0.1)
            if peak is not None:
                with contextlib.suppress(OSError):
                    peak["rss_bytes"] = max(peak.get("rss_bytes", 0), peak_rss_bytes(proc.pid))
            seen = len(line.findall(log_path.read_text(encoding="utf-8", errors="replace")))
            if seen > len(cpu):
                try:
                    now = cpu_seconds(proc.pid)
                except (OSError, IndexError):  # it ended between poll() and the read
                    break
                cpu += [now] * (seen - len(cpu))
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed ({proc.returncode}); log {log_path}:\n{text[-3000:]}")
    return text, cpu


def summarise(
    windows: list[dict], cpu: list[float], steps: int, log_every: int, tgt_per_batch: float
) -> dict[str, Any]:
    """A training run's speed from its log windows (step, loss, tgt_tokens_per_s, tgt_tokens)
    and the CPU seconds at each: the medians over the windows after the first (start-up, first
    allocations) of target tokens per second and per CPU-second, and the last window's loss."""
    expected = steps // log_every
    if len(windows) < expected or len(windows) < 2 or len(cpu) < len(windows):
        sys.exit(f"expected {expected} log windows, parsed {len(windows)}: see the run's train.log")
    for w, before, after in zip(windows[1:], cpu, cpu[1:], strict=False):
        w["cpu_seconds"] = after - before
        w["tgt_tokens_per_cpu_s"] = w["tgt_tokens"] / max(after - before, 1e-9)
    steady = windows[1:]
    return {
        "windows": windows,
        "tgt_tokens_per_s": statistics.median(w["tgt_tokens_per_s"] for w in steady),
        "tgt_tokens_per_cpu_s": statistics.median(w["tgt_tokens_per_cpu_s"] for w in steady),
        "final_loss": windows[-1]["loss"],
        "final_step": windows[-1]["step"],
        "tgt_tokens_per_batch": tgt_per_batch,
    }


def timed_train(
    cmd: list[str], run_dir: Path, threads: int, steps: int, log_every: int,
    peak: dict[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run a train stage (``train_command``) of ``steps`` updates logged every ``log_every``;
    its speed (``summarise``; the train log has no per-window token count: each window gets the
    run's mean target tokens per batch, from its summary) and the precision it trained in."""
    log, cpu = run_logged(cmd, run_dir, threads, TRAIN_LINE, peak)
    windows = [
        {"step": int(m[1]), "loss": float(m[2]), "tgt_tokens_per_s": float(m[3])}
        for m in TRAIN_LINE.finditer(log)
    ]
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    tgt_per_batch = summary["train_tokens_this_job"]["tgt"] / summary["final_step"]
    for w in windows:
        w["tgt_tokens"] = tgt_per_batch * log_every
    row = summarise(windows, cpu, steps, log_every, tgt_per_batch)
    row["precision"] = summary["precision"]
    return row


# --- an experiment and its stages -------------------------------------------------------------


def key_values(items: list[str], where: str) -> list[tuple[str, Any]]:
    """A command line's ``KEY=VALUE`` words, each value read as YAML; a word that is not one
    exits, naming ``where`` (the script and option)."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"{where}: {item!r} is not key=value")
        pairs.append((key, yaml.safe_load(value)))
    return pairs


def train_settings(train: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """An experiment's train settings with a benchmark's ``overrides``, which also win over its
    ``train.by_precision`` entries: a benchmark's own step counts hold in every precision, and
    an entry stays (emptied) so that ``precision: auto`` still chooses as the config does."""
    by_precision = {
        precision: {key: value for key, value in values.items() if key not in overrides}
        for precision, values in (train.get("by_precision") or {}).items()
    }
    return {**copy.deepcopy(train), **overrides, "by_precision": by_precision}


@dataclass
class Experiment:
    """One run of a config's experiments as the pipeline resolves it: ``settings`` (the
    validated experiment, defaults filled in) and its files, relative to the working directory
    of the DAG that built them."""

    config_path: Path
    name: str
    pipeline: Any  # transformer_nmt.experiments.Pipeline

    @property
    def settings(self) -> dict[str, Any]:
        return self.pipeline.experiment(self.name)

    @property
    def src(self) -> str:
        return self.pipeline.langs(self.name)[0]

    @property
    def tgt(self) -> str:
        return self.pipeline.langs(self.name)[1]

    @property
    def spm(self) -> str:
        return self.pipeline.spm_model(self.name)

    @property
    def bin_dir(self) -> str:
        return self.pipeline.bin_dir(self.name)

    @property
    def train_config_file(self) -> str:
        """The train settings the pipeline's train rule reads (``TRAIN_CONFIG``)."""
        from transformer_nmt.experiments.paths import TRAIN_CONFIG

        return TRAIN_CONFIG.format(experiment=self.name)

    def text(self, split: str, lang: str) -> str:
        """A split's text file in ``lang`` (the prepare stage's output)."""
        side = "src" if lang == self.src else "tgt"
        return self.pipeline.test_file(self.name, split, side)

    def train_config(self, **overrides: Any) -> dict[str, Any]:
        """What ``train --config-file`` reads (``Pipeline.train_config``), with a benchmark's
        train settings (``train_settings``)."""
        config = copy.deepcopy(self.pipeline.train_config(self.name))
        config["train"] = train_settings(config["train"], **overrides)
        return config

    def data_targets(self, sets: list[str]) -> list[str]:
        """The files a train stage reads, and the text of ``sets`` on both sides."""
        name = self.name
        return [
            self.spm, self.pipeline.clean_report(name), *self.pipeline.train_bin_files(name),
            *(self.text(s, lang) for s in sets for lang in (self.src, self.tgt)),
        ]  # fmt: skip


def load_experiment(
    config_path: Path, name: str | None = None,
    edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Experiment:  # fmt: skip
    """Experiment ``name`` (default: the config's only one; a seeded experiment: its first
    seed's run) of the config file, validated as the Snakefile validates it; ``edit`` returns
    the experiment's settings a benchmark changes (validated too). Exits with the config error."""
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from transformer_nmt.errors import ConfigError
    from transformer_nmt.experiments import validated_pipeline

    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    experiments = config.get("experiments") or {}
    if name is None:
        if len(experiments) != 1:
            sys.exit(f"{config_path} has {len(experiments)} experiments: name one (--experiment)")
        name = next(iter(experiments))
    if edit is not None and name in experiments:
        experiments[name] = edit(copy.deepcopy(experiments[name]))
    try:
        pipeline = validated_pipeline(config, str(config_path))
    except ConfigError as err:
        sys.exit(str(err))
    if name not in pipeline.experiments():
        if name not in pipeline.groups:
            sys.exit(f"no experiment {name!r} in {config_path}; it has {sorted(experiments)}")
        name = pipeline.groups[name][0]
    return Experiment(config_path, name, pipeline)


def snakemake(
    configfile: Path, targets: list[str], workdir: Path = REPO, mirror: str | Path | None = None
) -> float:
    """The pipeline's DAG for ``targets`` (all: none given) of ``configfile``, in ``workdir``,
    the data from ``mirror`` when given; its minutes."""
    # Options taking lists first: "--cores N" ends them before the targets.
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--configfile", str(configfile)]
    if mirror:
        cmd += ["--config", f"data_mirror={mirror}"]
    cmd += ["--quiet", "rules", "--cores", str(os.cpu_count() or 1), *targets]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=workdir, check=True, env=python_env())
    return (time.perf_counter() - start) / 60


def build_data(exp: Experiment, sets: list[str], mirror: str | None) -> None:
    """The experiment's data (download, prepare, spm, encode) by the pipeline's own rules, in
    the repository root: what its train stage reads, and the text of ``sets``."""
    snakemake(exp.config_path, exp.data_targets(sets), REPO, mirror)


def run_dag(config: dict[str, Any], workdir: Path, mirror: Path | None) -> float:
    """The whole DAG of ``config`` (written to ``workdir/config.yaml``) in ``workdir``; its
    minutes."""
    workdir.mkdir(parents=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return snakemake(path, [], workdir, mirror)


def stage(name: str, *args: str) -> list[str]:
    """``python -m transformer_nmt <name> <args>`` with this interpreter."""
    return [sys.executable, "-m", "transformer_nmt", name, *args]


def run_stage(cmd: list[str], log: Path | None = None, cwd: Path = REPO) -> None:
    """Run a stage's command line, its output to ``log``; exit with the log's tail on failure."""
    with open(log or os.devnull, "w", encoding="utf-8") as handle:
        proc = subprocess.run(cmd, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8")[-3000:] if log else ""
        sys.exit(f"stage {cmd[3]} failed ({proc.returncode}):\n{tail}")


# The data stages on files of a benchmark's own (bench_data.py: a synthetic corpus and registry),
# flag for flag as the data rules of workflow/rules/data.smk run them (tests/test_benchmark_scripts
# compares them with `snakemake -n -p`).


def download_command(registry: Path, dataset: str, out_dir: Path) -> list[str]:
    return stage("download", "--registry", str(registry), "--dataset", dataset,
                 "--out-dir", str(out_dir))  # fmt: skip


def prepare_command(
    registry: Path, dataset: str, pair: str, raw_dir: Path, out_dir: Path, workers: int,
    clean: str | None = None,
) -> list[str]:  # fmt: skip
    """``clean``: the pair's cleaning rules as JSON (default: the stage's defaults)."""
    cmd = stage("prepare", "--registry", str(registry), "--dataset", dataset, "--pair", pair,
                "--raw-dir", str(raw_dir), "--out-dir", str(out_dir))  # fmt: skip
    return cmd + (["--clean", clean] if clean is not None else []) + ["--workers", str(workers)]


def spm_train_command(
    inputs: list[Path], vocab_size: int, sample_sentences: int, seed: int, prefix: Path
) -> list[str]:
    return stage("spm-train", "--inputs", *map(str, inputs), "--vocab-size", str(vocab_size),
                 "--sample-sentences", str(sample_sentences), "--seed", str(seed),
                 "--model-prefix", str(prefix))  # fmt: skip


def encode_command(spm_model: Path, inputs: list[Path], out_dir: Path, workers: int) -> list[str]:
    return stage("encode", "--spm-model", str(spm_model), "--inputs", *map(str, inputs),
                 "--out-dir", str(out_dir), "--workers", str(workers))  # fmt: skip


def train_command(
    exp: Experiment, run_dir: Path, config: dict[str, Any] | None = None, tracking: bool = False
) -> list[str]:
    """The train rule's command line (``Pipeline.train_command``) for ``exp`` in ``run_dir``,
    with ``config`` (default: the experiment's, ``Experiment.train_config``) written to
    ``run_dir/train_config.json`` for it; MLflow with ``tracking``. Its data paths are relative
    to the DAG's working directory: run it there."""
    from transformer_nmt.runs.layout import TRAIN_CONFIG_FILE

    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / TRAIN_CONFIG_FILE
    write_result(config_file, config if config is not None else exp.train_config())
    words = exp.pipeline.train_command(exp.name, str(run_dir), str(config_file), tracking)
    return [sys.executable, *words[1:]]  # "python": this interpreter


def translate_command(
    exp: Experiment, model: Path, source: str, output: Path, device: str | None = None
) -> list[str]:
    """The translate stage on ``source`` with the experiment's search (the translate rule's
    ``search_flags``; decoded as trained, no quantisation)."""
    search = exp.pipeline.search_flags(exp.name).split()
    cmd = stage("translate", "--model", str(model), "--spm-model", exp.spm, "--input", source,
                "--output", str(output), *search)  # fmt: skip
    return cmd + ["--device", device] if device else cmd


def score_command(exp: Experiment, hyp: Path, ref: str, out: Path) -> list[str]:
    """The score stage as the score rule runs it (its language flags,
    ``score_language_and_flags``)."""
    language = exp.pipeline.score_language_and_flags(exp.name).split()
    return stage("score", "--hyp", str(hyp), "--ref", ref, "--tgt-lang", *language,
                 "--out", str(out))  # fmt: skip


def average_command(inputs: list[str], out: Path) -> list[str]:
    """The average stage over the checkpoint files ``inputs``."""
    return stage("average", "--inputs", *inputs, "--out", str(out))
