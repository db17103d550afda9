"""Mutation testing of the paper's core: how many small faults planted in the model,
the search, the loss and schedule, and the BLEU scoring do the fast unit tests catch?

Run by hand, not in CI, and not a dependency of the project: one command from the repository
root, with any Python 3.11+ (the script itself needs only the standard library)::

    nice -n 10 python3 benchmarks/mutation_test.py            # the whole run (~20-25 min)
    python3 benchmarks/mutation_test.py --only 'src/transformer_nmt/search/*'   # a part
    python3 benchmarks/mutation_test.py --rerun-survivors      # the last run's survivors only
    python3 benchmarks/mutation_test.py --report               # table and JSON of the last run

It creates (first time only) its own virtual environment ``.venv-mut`` (torch 2.13.0 first, as
the Makefile does, then the package with its test tools, then mutmut, pinned), copies ``src/``,
``tests/`` and ``pyproject.toml`` into ``.mutmut-work/`` with a ``[tool.mutmut]`` section (the
project's own pyproject.toml stays as it is) and runs mutmut there with ONE worker and one
torch thread (a shared 2-core machine). mutmut runs, for each mutant, only the selected tests
that call the mutated function (``TESTS``; slow training/workflow tests are left out).

It prints a table (module, mutants, killed, survived, timeout, score) and writes
``benchmarks/out/mutation.json``: the commit, the machine (``harness.machine``), tool versions,
wall time, the per-module counts and every surviving mutant with its diff and verdict. The
score is (killed + timeout) / mutants: a mutant whose tests time out (an endless loop) is
detected, one whose function no selected test calls ("no tests") is not. Survivors that are
equivalent mutants (no test can tell them from the code) were judged by hand: ``EQUIVALENT``
below, summarised in benchmarks/log/2026-11-26.md ("Mutation testing of the paper's core");
the "non-equiv." score leaves them out. ``--baseline`` tables an earlier run's JSON beside this one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-mut"
WORK = REPO / ".mutmut-work"
OUT = REPO / "benchmarks" / "out" / "mutation.json"

TORCH = "torch==2.13.0"  # the Makefile's pin: a CPU wheel here, never an unpinned torch
MUTMUT = "mutmut==3.8.1"

# The paper's core: the model (§3), search (§6.1), loss and schedule (§5.3, §5.4), BLEU (§6.1).
MODULES = [
    "src/transformer_nmt/model/*",
    "src/transformer_nmt/search/*",
    "src/transformer_nmt/training/objective.py",
    "src/transformer_nmt/training/loss_kernels.py",
    "src/transformer_nmt/training/optimizer.py",
    "src/transformer_nmt/evaluation/score.py",
]

# The unit tests that exercise those modules, each in seconds. Left out: tests/test_learning.py
# (trains a model, ~10 s), tests/test_model_gpu.py (skips without CUDA) and the deselected
# slow or integration tests below.
TESTS = [
    "tests/test_model_config.py",
    "tests/test_model_dropout.py",
    "tests/test_model_transformer.py",
    "tests/test_param_counts.py",
    "tests/test_search.py",
    "tests/test_fast_paths.py",
    "tests/test_objective.py",
    "tests/test_optimizer.py",
    "tests/test_loss_normalisation.py",
    "tests/test_score.py",
]
# Tests added for surviving mutants (new files, run when present).
EXTRA_TESTS = ["tests/test_core_invariants.py"]
DESELECT = [
    # torch.compile of a training step (~30 s), two DDP processes (~11 s)
    "tests/test_loss_normalisation.py::test_compiled_training_steps_equal_eager_ones",
    "tests/test_loss_normalisation.py::test_two_ddp_ranks_with_accumulation_give_the_gradient_of_one_batch",
    # torch.compile of the model's forward: mutmut's trampolines around every function are graph
    # breaks, so the one-graph check fails on the unmutated code under mutmut
    "tests/test_model_transformer.py::test_the_training_forward_compiles_to_one_graph",
    # the score CLI logging into MLflow: the CLI and tracking, not the scoring
    "tests/test_score.py::test_cli_logs_scores_into_the_experiments_mlflow_run",
    "tests/test_score.py::test_cli_logs_the_intervals_into_mlflow",
]

# Survivors judged equivalent by hand (benchmarks/log/2026-11-26.md): short name (``short_name``) ->
# reason. They leave the denominator of the "non-equivalent" score; nothing else changes.
REASONS = {
    "cpu": "device=None or no device: the same tensor here, where everything is on the CPU "
    "(only a CUDA run can tell)",
    "axis": "dim +1 for -1 (or +2 for -2) on a tensor of that rank: the same axis",
    "inf": 'float("-INF") == float("-inf")',
    "default": "an argument dropped or set to the value the callee defaults to anyway",
    "int64": "torch.full/arange/tensor of Python ints infer int64 (= torch.long)",
    "promote": "a dtype argument that type promotion or a later cast makes irrelevant",
    "softmax": "a CPU softmax of bf16/fp16 accumulates in float32 already: identical output",
    "equal-len": "zip(strict=...) or a size check over sequences equal by construction",
    "recompute": "a value recomputed or copied instead of reused (projections, attention "
    "weights, logits of every position, an identity reorder): the same numbers, only slower",
    "buffer": "buffer or cache sizing/reuse only (sinusoid table, loss chunk rows, logits "
    "buffer, spare key/value buffers): the same values",
    "falsy": "None for False (or a truthy/falsy value read only as a condition)",
    "swallowed": "text of an exception that is caught and replaced by another message",
    "unused": "an attribute or result that nothing reads",
    "unreachable": "a branch no input of this code reaches",
    "later-stop": "beam search decodes more steps and returns the same hypotheses: the "
    "early-stopping bound only stops a sentence sooner (search/beam.py)",
    "beam-pool": "3K instead of 2K candidates per step: the K best non-EOS candidates are "
    "among the 2K best either way",
    "same-source": "a beam reorder treated as a batch reorder: each sentence reselects its "
    "own source rows, the same tensors",
    "warning": "sacreBLEU's force=True only silences its 'already tokenized?' warning",
    "to-none": "tensor.to(None) returns the tensor unchanged",
    "overwritten": "an initial value overwritten before anything reads it",
    "paired": "the key and value buffers are set (and require grad) together: a test of one "
    "is a test of both",
    "initial-lr": "LambdaLR always sets initial_lr, and build_scheduler requires it to be 1.0",
    "dedup": "Module.parameters() yields a shared parameter once already",
    "topk-path": "row_topk's block path replaced by (or extended to) torch.topk: the same "
    "values, its contract (ties may come in another order)",
    "empty-tail": "an empty tail of columns concatenated: the same candidates",
    "dead-beam": "live hypotheses all at -inf: nothing can finish any more, the sentence only "
    "decodes on to its maximum length",
    "bound-term": "the bound's lp(step + 1) never exceeds lp(max_len + 1) before the last "
    "step, where the sentence stops anyway",
    "keep-finished": "finished sentences stay in the batch and decode on; outputs are cut at "
    "their first EOS: the same outputs",
    "dropout-p0": "F.dropout's training flag defaults to True, and p is 0 outside training",
    "kwargs": "**kwargs dropped where torch passes none (it calls positionally)",
}
EQUIVALENT_BY_REASON = {
    "cpu": """
    positional.sinusoidal_encoding#4 #7 #13 #18 #33 #37 positional.SinusoidalPositions.forward#2
    #4 #33 #35 dropout.bernoulli_keep_mask#5 #8
    transformer.Transformer.embed_source#6 #9 transformer.Transformer.embed_target#8 #12
    _stepper.Stepper.__init__#18 #20 greedy.greedy_search#28 #30 #35 #39 #68 #72
    beam.beam_search#20 #51 #54 #61 #65 #73 #77 #87 #89 #168 #170 #236 #238 #342 #345 #351 #353
    """,
    "axis": """
    attention.attention_probs#7 loss_kernels._chunk_buffer#14
    loss_kernels.SmoothedCrossEntropy.backward#3
    loss_kernels.SmoothedCrossEntropy.forward#48 #55 #63 transformer.key_padding_mask#9
    _stepper.Stepper.step#46 greedy.greedy_search#62
    """,
    "inf": """
    attention.attention_probs#32 _stepper.restrict_#7 #12 #17 #22 beam.beam_search#31
    """,
    "default": """
    positional.LearnedPositions.__init__#12 transformer.Transformer.reset_parameters#14 #24
    #35 #46 attention.MultiHeadAttention._load_from_state_dict#20 topk.row_topk#13 #26 #61
    beam.beam_search#135 #195 score.moses_tokenize#8
    """,
    "int64": """
    greedy.greedy_search#34 #38 #67 #71 beam.beam_search#72 #76
    """,
    "promote": """
    positional.sinusoidal_encoding#3 #6 beam.beam_search#127
    objective.chunked_label_smoothed_cross_entropy#22 #23 #28 #30
    """,
    "to-none": """
    positional.SinusoidalPositions.forward#39
    """,
    "softmax": """
    attention.attention_probs#33 #40 #42
    """,
    "equal-len": """
    transformer.Transformer.decode_step#14 #17 #18 optimizer.follow_max_steps#4 #7
    #8
    """,
    "recompute": """
    attention.MultiHeadAttention.attend#59 attention.MultiHeadAttention.forward#13
    #20 layers.DecoderLayer.forward#16 #21 _stepper.Stepper.__init__#14 _stepper.Stepper.step#23
    #27 #28 beam.beam_search#338 transformer.DecoderState.reorder#6
    """,
    "buffer": """
    positional.SinusoidalPositions.__init__#1 positional.SinusoidalPositions.forward#23
    #24 #26 #27 #29 #30 #31 transformer.Transformer.__init__#56 #61
    transformer.Transformer._project_into#2 #5 #10 #11 #12 loss_kernels._chunk_buffer#7
    loss_kernels._chunks#8 loss_kernels._loss_rows#1 #2 #3 #4 #5 _stepper.Stepper.__init__#27 #28
    _stepper.Stepper.step#42 #45 layers.LayerCache.reorder#17 #52 #71 #72 #73 #74
    """,
    "falsy": """
    transformer.Transformer.__init__#32 layers.DecoderLayer.__init__#9
    """,
    "swallowed": """
    config._coerce#21 #23 #26 #29
    """,
    "unused": """
    _stepper.Stepper.__init__#3 attention.MultiHeadAttention.forward#7
    layers.DecoderLayer.forward#12 greedy.greedy_search#19 #25
    """,
    "unreachable": """
    _stepper.Stepper.step#48 #49 #50 #51 #52 #53 greedy.greedy_search#98
    """,
    "same-source": """
    _stepper.Stepper.reorder#4 #6 beam.beam_search#273 #275 #276
    """,
    "beam-pool": """
    beam.beam_search#110 #141
    """,
    "warning": """
    score.score_lines#42
    """,
    "overwritten": """
    layers.LayerCache.__init__#6 transformer.Transformer.decode#9
    transformer.Transformer.decode_step#7
    """,
    "paired": """
    layers.LayerCache.reorder#14 #18 #35
    """,
    "initial-lr": """
    optimizer.follow_max_steps#16 #17 #19 #20 #21 #22
    """,
    "dedup": """
    transformer.count_parameters#13 #18 #19
    """,
    "topk-path": """
    topk.row_topk#6 #7 #8 #9
    """,
    "empty-tail": """
    topk.row_topk#48 #49
    """,
    "dead-beam": """
    beam.beam_search#299
    """,
    "bound-term": """
    beam.beam_search#325 #326
    """,
    "keep-finished": """
    greedy.greedy_search#82
    """,
    "dropout-p0": """
    attention.MultiHeadAttention.attend#24
    """,
    "kwargs": """
    attention.MultiHeadAttention._load_from_state_dict#28
    """,
}


def _expand(by_reason: dict[str, str]) -> dict[str, str]:
    """``{"cpu": "a.f#4 #7 b.g#1"}`` -> ``{"a.f#4": "cpu", "a.f#7": "cpu", "b.g#1": "cpu"}``."""
    out = {}
    for reason, names in by_reason.items():
        function = ""
        for item in names.split():
            function = item.split("#")[0] or function  # "#7" continues the last function
            out[f"{function}#{item.split('#')[1]}"] = reason
    return out


EQUIVALENT = _expand(EQUIVALENT_BY_REASON)

# mutmut's exit code of a mutant's test run -> status (mutmut/stats.py, status_by_exit_code)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped"}
STATUS |= {36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout"}
STATUS |= {37: "caught by type check", -11: "segfault", -9: "segfault", None: "not checked"}


def sh(*cmd: str | Path, cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, text=True, **kw)


def ensure_venv() -> None:
    """``.venv-mut``: torch pinned first (so the package does not pull another build), the
    package with its test extras, then mutmut."""
    py = VENV / "bin" / "python"
    if (VENV / "bin" / "mutmut").exists():
        return
    if not py.exists():
        sh(sys.executable, "-m", "venv", VENV, check=True)
    pip = [py, "-m", "pip", "install", "--quiet"]
    sh(*pip, TORCH, check=True)
    sh(*pip, "-e", ".[test]", check=True)
    sh(*pip, MUTMUT, check=True)


def tests_present() -> list[str]:
    return TESTS + [t for t in EXTRA_TESTS if (REPO / t).exists()]


def mutmut_config(only: list[str]) -> str:
    selection = tests_present()
    for node in DESELECT:
        selection += ["--deselect", node]

    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        # tests read the shipped configs and the benchmarks' scripts beside src/
        'also_copy = ["config", "benchmarks"]\n'
        f"only_mutate = {toml_list(only)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(selection)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
        # the work dir is no git repository of its own (it lies inside this one)
        "use_git_change_detection = false\n"
    )


def prepare_work(only: list[str], fresh: bool) -> None:
    """``.mutmut-work``: src/, tests/, config/, benchmarks/ and pyproject.toml with the mutmut
    section. Fresh: mutmut's results and stats are removed too; otherwise mutmut keeps results
    of unchanged mutants."""
    if fresh and WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(exist_ok=True)
    for name in ("src", "tests", "config", "benchmarks"):
        shutil.rmtree(WORK / name, ignore_errors=True)
        shutil.copytree(
            REPO / name,
            WORK / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "out"),
        )
        if (WORK / "mutants" / name).exists() and name == "tests":
            # mutmut copies tests/ only over what is there: bring new test files in
            shutil.copytree(WORK / name, WORK / "mutants" / name, dirs_exist_ok=True)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    (WORK / "pyproject.toml").write_text(pyproject + mutmut_config(only), encoding="utf-8")


def env() -> dict[str, str]:
    e = dict(os.environ)
    # one worker and one thread each: the machine is 2 shared cores; also fork-safe for torch
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    e["PATH"] = f"{VENV / 'bin'}:{e.get('PATH', '')}"
    return e


def run_mutmut(names: list[str], log: Path) -> int:
    cmd = ["nice", "-n", "10", str(VENV / "bin" / "mutmut"), "run", "--max-children", "1"]
    with log.open("w") as f:
        return subprocess.run(
            cmd + names, cwd=WORK, env=env(), stdout=f, stderr=subprocess.STDOUT
        ).returncode


def short_name(mutant: str) -> str:
    """``transformer_nmt.model.positional.xǁSinusoidalPositionsǁforward__mutmut_12`` ->
    ``positional.SinusoidalPositions.forward#12``."""
    head, number = mutant.rsplit("__mutmut_", 1)
    module, function = re.match(r"transformer_nmt\.(?:\w+\.)*?(\w+)\.x[_ǁ](.*)$", head).groups()
    return f"{module}.{function.replace('ǁ', '.')}#{number}"


def collect_results() -> dict[str, dict[str, str]]:
    """{source file: {mutant name: status}} from mutmut's ``mutants/**/*.py.meta`` files."""
    results: dict[str, dict[str, str]] = {}
    for meta in sorted((WORK / "mutants" / "src").rglob("*.py.meta")):
        source = str(meta.relative_to(WORK / "mutants"))[: -len(".meta")]
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        results[source] = {k: STATUS.get(v, "suspicious") for k, v in sorted(codes.items())}
    return results


def restore_verdicts(earlier: dict[str, dict[str, int | None]], rerun: set[str]) -> None:
    """After a rerun of named mutants: mutmut resets every cached verdict when the test
    selection changes (a new test file); tests were only added, so a mutant killed before is
    still killed: write the earlier exit codes back for the mutants not rerun."""
    for meta in (WORK / "mutants" / "src").rglob("*.py.meta"):
        source = str(meta.relative_to(WORK / "mutants"))[: -len(".meta")]
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        for name, code in earlier.get(source, {}).items():
            if name not in rerun and name in codes:
                codes[name] = code
        meta.write_text(json.dumps(data, indent=4))


def exit_codes() -> dict[str, dict[str, int | None]]:
    return {
        str(meta.relative_to(WORK / "mutants"))[: -len(".meta")]: json.loads(meta.read_text()).get(
            "exit_code_by_key", {}
        )
        for meta in (WORK / "mutants" / "src").rglob("*.py.meta")
    }


def diff_of(name: str) -> str:
    p = sh(VENV / "bin" / "mutmut", "show", name, cwd=WORK, env=env(), capture_output=True)
    return p.stdout.strip()


def verdict(name: str, status: str) -> str:
    """mutmut's status, with surviving mutants judged equivalent by hand as "equivalent"."""
    if status in ("survived", "no tests") and short_name(name) in EQUIVALENT:
        return "equivalent"
    return status


def counts(verdicts: list[str]) -> dict[str, float]:
    kinds = ("killed", "timeout", "survived", "no tests", "equivalent")
    c = {k: verdicts.count(k) for k in kinds}
    c["mutants"] = len(verdicts)
    c["other"] = c["mutants"] - sum(c[k] for k in kinds)
    # a mutant whose tests time out (an endless loop) is detected too
    detected = c["killed"] + c["timeout"]
    c["score"] = detected / c["mutants"] if c["mutants"] else float("nan")
    c["score_non_equivalent"] = detected / (c["mutants"] - c["equivalent"])
    return c


def machine() -> dict:
    """The machine (``harness.machine``), described by the mutation venv's Python: this
    script's own needs only the standard library."""
    code = "import harness, json; print(json.dumps(harness.machine()))"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), str(REPO / "src")]),
    }
    out = sh(VENV / "bin" / "python", "-c", code, capture_output=True, check=True, env=env).stdout
    return json.loads(out)


def versions() -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in ('mutmut', 'torch', 'pytest')} "
        "| {'python': sys.version.split()[0]}))"
    )
    out = sh(VENV / "bin" / "python", "-c", code, capture_output=True, check=True).stdout
    return json.loads(out)


def table(statuses: dict[str, dict[str, str]]) -> tuple[list[dict], list[dict]]:
    """Per-file rows and per-MODULES totals of ``{file: {mutant: mutmut status}}``."""
    rows = []
    groups: dict[str, list[str]] = {}
    for source, by_name in statuses.items():
        verdicts = [verdict(name, status) for name, status in by_name.items()]
        if not verdicts:
            continue
        rows.append({"module": source, **counts(verdicts)})
        group = next(m for m in MODULES if re.fullmatch(m.replace("*", ".*"), source))
        groups.setdefault(group, []).extend(verdicts)
    totals = [{"module": g, **counts(v)} for g, v in groups.items()]
    totals.append({"module": "all", **counts([v for vs in groups.values() for v in vs])})
    return rows, totals


def statuses_of(payload: dict) -> dict[str, dict[str, str]]:
    """``{file: {mutant: status}}`` back from a written JSON (killed ones unnamed)."""
    out: dict[str, dict[str, str]] = {}
    for row in payload["rows"]:
        by_name = out.setdefault(row["module"], {})
        for i in range(row["killed"]):
            by_name[f"killed-{i}"] = "killed"
        listed = sum(
            s["module"] == row["module"] and s["status"] == "timeout" for s in payload["survivors"]
        )
        for i in range(row["timeout"] - listed):
            by_name[f"timeout-{i}"] = "timeout"
    for s in payload["survivors"]:
        out[s["module"]][s["name"]] = s["status"]
    return out


def print_table(rows: list[dict], totals: list[dict]) -> None:
    head = (
        f"{'module':<46} {'mutants':>7} {'killed':>6} {'t/o':>4} {'surv.':>5} {'none':>4} "
        f"{'equiv.':>6} {'score':>6} {'non-equiv.':>10}"
    )
    print("\n" + head)
    for r in rows + [None] + totals:
        if r is None:
            print("-" * len(head))
            continue
        print(
            f"{r['module']:<46} {r['mutants']:>7} {r['killed']:>6} {r['timeout']:>4} "
            f"{r['survived']:>5} {r['no tests']:>4} {r['equivalent']:>6} "
            f"{100 * r['score']:>5.1f}% {100 * r['score_non_equivalent']:>9.1f}%"
        )


def report(wall_s: float | None, args: argparse.Namespace) -> None:
    results = collect_results()
    previous = json.loads(OUT.read_text()) if OUT.exists() else {}
    before = None
    if args.baseline:
        before = json.loads(Path(args.baseline).read_text())
    elif args.rerun_survivors and previous:
        before = previous.get("before") or previous  # the run whose survivors were rerun
    elif args.report:
        before = previous.get("before")
    if before:
        before = {"meta": before["meta"], "survivors": before["survivors"], "rows": before["rows"]}
        before["rows"], before["totals"] = table(statuses_of(before))
        print(f"\nbefore ({before['meta']['date']}, commit {before['meta']['commit'][:12]}):")
        print_table(before["rows"], before["totals"])
        print("\nafter:")
    rows, totals = table(results)
    print_table(rows, totals)
    survivors = [
        {
            "name": name,
            "short": short_name(name),
            "module": source,
            "status": status,
            "verdict": REASONS[EQUIVALENT[short_name(name)]]
            if verdict(name, status) == "equivalent"
            else None,
            "diff": diff_of(name),
        }
        for source, by_name in results.items()
        for name, status in by_name.items()
        if status not in ("killed", "timeout")
    ]
    unjudged = [s for s in survivors if s["verdict"] is None]
    stale = sorted(
        short_name(n)
        for by_name in results.values()
        for n, st in by_name.items()
        if st in ("killed", "timeout") and short_name(n) in EQUIVALENT
    )
    print(
        f"\n{len(survivors)} mutants survived, {len(survivors) - len(unjudged)} of them judged "
        f"equivalent (diffs in {OUT.relative_to(REPO)}); not judged:"
    )
    for s in unjudged:
        print(f"  {s['status']:<9} {s['short']}")
    if stale:
        print(f"killed although listed as equivalent (remove from EQUIVALENT): {stale}")

    commit = sh("git", "rev-parse", "HEAD", capture_output=True).stdout.strip()
    dirty = bool(
        sh("git", "status", "--porcelain", "--", "src", "tests", capture_output=True).stdout
    )
    meta = {
        "commit": commit + (" (+ uncommitted changes in src/ or tests/)" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "versions": versions(),
        "modules": MODULES if not args.only else args.only,
        "tests": tests_present(),
        "deselected": DESELECT,
        "workers": 1,
        "torch_threads": 1,
        "mode": "rerun-survivors" if args.rerun_survivors else "full",
        "wall_s": wall_s,
        "load_average_1min": os.getloadavg()[0],
    }
    if args.report and previous:  # a table of the last run: its own time and mode
        meta.update({k: previous["meta"][k] for k in ("wall_s", "mode", "commit", "date")})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "rows": rows, "totals": totals, "survivors": survivors}
    if before:  # the baseline (or the run whose survivors were rerun), re-judged
        payload["before"] = before
    OUT.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", help="glob(s) of files to mutate (default: MODULES)")
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="rerun only the mutants the last run did not kill (after adding tests)",
    )
    parser.add_argument("--resume", action="store_true", help="keep mutmut's earlier results")
    parser.add_argument("--report", action="store_true", help="only the table and JSON")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="the JSON of an earlier run (e.g. before tests were added), tabled beside this one",
    )
    args = parser.parse_args()

    ensure_venv()
    wall = None
    if not args.report:
        names: list[str] = []
        if args.rerun_survivors:
            names = [
                name
                for by_name in collect_results().values()
                for name, status in by_name.items()
                if status != "killed"
            ]
            if not names:
                sys.exit("no surviving mutants to rerun")
        prepare_work(args.only or MODULES, fresh=not (args.resume or args.rerun_survivors))
        log = WORK / "mutmut.log"
        start = time.perf_counter()
        earlier = exit_codes() if names else {}
        code = run_mutmut(names, log)
        wall = time.perf_counter() - start
        if names:
            restore_verdicts(earlier, set(names))
        print(f"mutmut exited {code} after {wall / 60:.1f} min (log: {log.relative_to(REPO)})")
        if code != 0:
            print(log.read_text()[-4000:])
            sys.exit(code)
    report(wall, args)


if __name__ == "__main__":
    main()
