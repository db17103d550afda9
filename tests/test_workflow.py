"""The whole Snakemake DAG on a slice of Multi30k: outputs, MLflow runs, no-op re-run, re-runs.

One real run (module-scoped) of the two experiments of .test/config/config.yaml (a tiny model,
a few steps), from the shared dataset mirror, in a temporary working directory; later tests
only dry-run against it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
import yaml

from tests.conftest import REPO_ROOT, checkout_pythonpath, snakemake_command, wait_for_health
from transformer_nmt.runs.metrics_history import read_metrics

pytestmark = pytest.mark.slow

TEST_CONFIG = REPO_ROOT / ".test" / "config" / "config.yaml"


def _config(mirror: Path) -> dict[str, Any]:
    """The repo's test config (.test/config/config.yaml) reading from ``mirror``."""
    config = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    return {**config, "data_mirror": str(mirror)}


def _snakemake(workdir: Path, config: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    snakemake = snakemake_command()
    cmd = [*snakemake, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--directory", str(workdir), "--configfile", str(path), *args]  # fmt: skip
    # PYTHONPATH: the jobs run this checkout's package, not whichever one is installed.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
           "PYTHONPATH": checkout_pythonpath()}  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def _planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The "Job stats" table of a dry run: rule -> count (empty when nothing is to be done)."""
    text = result.stdout + result.stderr
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", text, re.M)}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, shared_mirror: Path) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("workflow")
    config = _config(shared_mirror)
    result = _snakemake(workdir, config)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    return {"workdir": workdir, "config": config, "log": log}


def test_every_output_exists_and_is_well_formed(pipeline: dict[str, Any]) -> None:
    wd: Path = pipeline["workdir"]
    settings = pipeline["config"]["data"]["multi30k"]["en-de"]
    n = settings["clean"]["max_sentences"]  # sentences per split
    data = wd / "results" / "data" / "multi30k" / "en-de"
    for split in ("train", "valid", "test_2016_flickr", "test_2017_flickr"):
        for lang in ("en", "de"):
            assert len((data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()) == n
    assert (wd / "results" / "spm" / "multi30k" / "en-de" / "spm.model").stat().st_size > 0
    clean = json.loads((data / "clean_report.json").read_text(encoding="utf-8"))
    for split in ("valid", "test_2016_flickr", "test_2017_flickr"):
        overlap = clean["splits"][split]["train_overlap"]
        assert overlap["sentences"] == n and 0 <= overlap["pair"] <= overlap["source"] <= n
    for name, exp in pipeline["config"]["experiments"].items():
        run = wd / "results" / "runs" / name
        summary = json.loads((run / "train_summary.json").read_text(encoding="utf-8"))
        assert summary["final_step"] == exp["train"]["max_steps"]
        assert summary["vocab"]["size"] == settings["vocab_size"]
        checkpoints = sorted((run / "checkpoints").glob("step=*.ckpt"))
        assert len(checkpoints) == exp["average_last_k"]  # keep_checkpoints == average_last_k
        assert checkpoints[-1].name == f"step={exp['train']['max_steps']:08d}.ckpt"
        assert (run / "averaged.pt").stat().st_size > 0
        model = {"preset": exp["preset"], "overrides": exp["model_overrides"]}
        settings_file = json.loads((run / "train_config.json").read_text(encoding="utf-8"))
        assert settings_file == {"model": model, "train": exp["train"]}
        for test_set in exp["test_sets"]:
            hyp = (run / f"{test_set}.hyp").read_text(encoding="utf-8")
            assert len(hyp.splitlines()) == n
            scores = json.loads((run / f"{test_set}.scores.json").read_text(encoding="utf-8"))
            assert scores["sentences"] == n and scores["tgt_lang"] == "de"
            # the scores are those of this .hyp against the test set's references (a model of
            # 20 steps scores ~0: the values say nothing of the model, only of the scoring)
            refs = (data / f"{test_set}.de").read_text(encoding="utf-8").splitlines()
            hyps = hyp.splitlines()
            for key, metric in (("bleu", sacrebleu.BLEU()), ("chrf", sacrebleu.CHRF())):
                expected = metric.corpus_score(hyps, [refs]).score
                assert scores[key]["score"] == pytest.approx(expected, abs=1e-9), key
            for key in ("bleu_paper", "bleu_lc_tok"):
                assert 0.0 <= scores[key]["score"] <= 100.0
            assert "tok:13a" in scores["bleu"]["signature"]
        # attention maps of the first 3 test lines: PNG + CSV (panel rows of heads and mean)
        h = exp["model_overrides"]["h"]
        for line in (1, 2, 3):
            assert (run / "figures" / f"attention_{line}.png").read_bytes()[:4] == b"\x89PNG"
            table = (run / "figures" / f"attention_{line}.csv").read_text(encoding="utf-8")
            panels = {row.split(",")[0] for row in table.splitlines()[1:]}
            assert panels == {*(f"head_{i + 1}" for i in range(h)), "mean"}
        if exp["translate"]["alpha"] == "auto":  # chosen on dev, then used by translate
            chosen = json.loads((run / "alpha_selection.json").read_text(encoding="utf-8"))
            tried = {f"{a:g}" for a in exp["translate"]["alpha_candidates"]}
            assert set(chosen["dev_bleu"]) == tried and f"{chosen['best_alpha']:g}" in tried
            log = (wd / "logs" / "translate" / name / f"{exp['test_sets'][0]}.log").read_text()
            assert f"alpha {chosen['best_alpha']:g}, chosen on the dev set" in log
        else:
            assert not (run / "alpha_selection.json").exists()
        for stage in ("train", "average"):
            assert (wd / "logs" / stage / f"{name}.log").is_file()
            assert (wd / "results" / "benchmarks" / stage / f"{name}.tsv").is_file()
    report = (wd / "results" / "report.md").read_text(encoding="utf-8")
    results_table = report.split("\n## ")[0]  # the other sections' tables come after it
    rows = [ln for ln in results_table.splitlines() if ln.startswith("| smoke_")]
    assert [r.split("|")[1].strip() + "/" + r.split("|")[4].strip() for r in rows] == [
        "smoke_a/test_2016_flickr", "smoke_a/test_2017_flickr", "smoke_b/test_2016_flickr",
    ]  # fmt: skip
    # the learning curves: metrics.csv per run, figures (PNG + CSV) embedded in the report
    figures = wd / "results" / "figures"
    for name, exp in pipeline["config"]["experiments"].items():
        train = exp["train"]
        rows = read_metrics(wd / "results" / "runs" / name / "metrics.csv")
        steps = [r.step for r in rows if "train_loss" in r.values]
        assert steps == list(range(5, train["max_steps"] + 1, train["log_every_steps"]))
        validated = [r.step for r in rows if "val_loss" in r.values]
        # (where validations fall with gradient accumulation is the trainer's business)
        assert validated and all(0 < s <= train["max_steps"] for s in validated)
        png = figures / "runs" / name / "learning_curves.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.with_suffix(".csv").is_file()
        assert f"](figures/runs/{name}/learning_curves.png)" in report
    assert "](figures/pairs/multi30k_en-de/learning_curves.png)" in report  # shared pair
    assert "a fixed number of checkpoints was averaged" in report  # average_last_k: K
    # smoke_b's alpha: auto (smoke_a's fixed 0.6 gets no row)
    assert "## Length penalty chosen on the dev set" in report
    assert "| smoke_b | 0.6: " in report and "| smoke_a | 0.6: " not in report


def test_models_are_registered_and_the_snakemake_report_has_the_results(
    pipeline: dict[str, Any],
) -> None:
    wd: Path = pipeline["workdir"]
    for name in pipeline["config"]["experiments"]:
        record = json.loads((wd / "results" / "runs" / name / "mlflow_model.json").read_text())
        assert record, f"{name}: empty MLflow model record"
    result = _snakemake(wd, pipeline["config"], "--report", str(wd / "report.zip"))
    assert result.returncode == 0, result.stderr[-3000:]
    import zipfile

    with zipfile.ZipFile(wd / "report.zip") as archive:
        names = archive.namelist()
    assert any(n.endswith("/report.md") for n in names), names[:20]
    assert any(n.endswith("test_2016_flickr.scores.json") for n in names)
    assert sum(n.endswith("learning_curves.png") for n in names) == 3  # 2 runs, 1 pair
    assert any(n.endswith("attention_1.png") for n in names)
    assert any(n.endswith("attention_1.csv") for n in names)


def test_terminal_output_is_short(pipeline: dict[str, Any]) -> None:
    # the settings travel in train_config.json, not as JSON on the printed command lines
    (train,) = [ln for ln in pipeline["log"].splitlines() if "transformer_nmt train " in ln][:1]
    assert "--config-file results/runs/" in train and "{" not in train
    assert '"max_steps"' not in pipeline["log"] and '"d_model"' not in pipeline["log"]


def test_mlflow_holds_one_run_per_experiment(pipeline: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    wd: Path = pipeline["workdir"]
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("multi30k_en-de")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["smoke_a", "smoke_b"]
    for run in runs:
        name = run.info.run_name
        exp = pipeline["config"]["experiments"][name]
        params, metrics = run.data.params, run.data.metrics
        assert params["train.max_steps"] == str(exp["train"]["max_steps"])
        assert any(k.startswith("average.") for k in params)
        for test_set in exp["test_sets"]:
            assert f"{test_set}.bleu" in metrics and f"{test_set}.chrf" in metrics
            assert params[f"translate.{test_set}.beam"] == "2"
        assert any("loss" in k for k in metrics)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"scores", "hypotheses", "report.md"} <= artifacts
        scores = {a.path for a in client.list_artifacts(run.info.run_id, "scores")}
        assert scores == {f"scores/{t}.scores.json" for t in exp["test_sets"]}
        # Hypotheses also as .txt (the MLflow UI previews those), the learning curve, the data.
        hyps = {a.path for a in client.list_artifacts(run.info.run_id, "hypotheses")}
        assert {f"hypotheses/{t}.txt" for t in exp["test_sets"]} <= hyps
        figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
        attention = {f"figures/attention_{i}.{ext}" for i in (1, 2, 3) for ext in ("png", "csv")}
        assert figures == {
            "figures/learning_curves.png",  # the report's (evaluation/figures.py), and data
            "figures/learning_curves.csv",
            "figures/multi30k_en-de",  # the pair's figure
            *attention,
        }
        assert params["data.vocab_size"] == str(
            pipeline["config"]["data"]["multi30k"]["en-de"]["vocab_size"]
        )
        assert "data.clean.max_length" in params and "data.spm.seed" in params
        assert "data.train.en.tokens_sha256" in run.data.tags


def test_the_run_ends_with_what_it_made(pipeline: dict[str, Any]) -> None:
    """After "N of N steps done": each experiment's BLEU per test set with its interval (the
    scores files'), the report's path and the command that opens the MLflow UI on the store."""
    wd: Path = pipeline["workdir"]
    log = pipeline["log"]
    assert "steps (100%) done" in log
    summary = log[log.index("steps (100%) done") :]
    lines = summary.splitlines()
    start = lines.index("sacreBLEU [95% bootstrap interval]:")
    rows = []
    for name, exp in sorted(pipeline["config"]["experiments"].items()):
        for test_set in exp["test_sets"]:
            bleu = json.loads((wd / f"results/runs/{name}/{test_set}.scores.json").read_text())
            low, high = bleu["bleu"]["ci95"]["low"], bleu["bleu"]["ci95"]["high"]
            score = f"{bleu['bleu']['score']:.2f} [{low:.2f}, {high:.2f}]"
            rows.append([name, test_set, score])
    assert [ln.split(maxsplit=2) for ln in lines[start + 1 : start + 1 + len(rows)]] == rows
    assert lines[start + 1 + len(rows)] == f"report: {wd.resolve() / 'results' / 'report.md'}"
    assert lines[start + 2 + len(rows)] == (
        f"MLflow UI: MLFLOW_TRACKING_URI=sqlite:///{wd / 'mlflow.db'} python -m transformer_nmt ui"
    )


def test_second_run_has_nothing_to_do(pipeline: dict[str, Any]) -> None:
    result = _snakemake(pipeline["workdir"], pipeline["config"], "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _planned_jobs(result) == {}
    assert "Nothing to be done" in result.stdout + result.stderr


def test_changing_a_training_value_reruns_training_and_downstream_only(
    pipeline: dict[str, Any],
) -> None:
    config = copy.deepcopy(pipeline["config"])
    config["experiments"]["smoke_b"]["train"]["warmup"] = 12
    result = _snakemake(pipeline["workdir"], config, "-n")
    jobs = _planned_jobs(result)
    assert "sacreBLEU [95% bootstrap interval]" not in result.stdout + result.stderr  # a dry run
    # smoke_b: its settings file, train, average, its length penalty (alpha: auto), its
    # registered MLflow model, translate + score of its one test set; the shared report.
    assert jobs == {
        "train_config": 1, "train": 1, "average": 1, "select_alpha": 1, "register": 1,
        "translate": 1, "score": 1, "attention_maps": 1, "report": 1, "all": 1, "total": 10,
    }  # fmt: skip


def test_changing_a_search_value_reruns_translation_and_scoring_only(
    pipeline: dict[str, Any],
) -> None:
    config = copy.deepcopy(pipeline["config"])
    config["experiments"]["smoke_a"]["translate"]["beam"] = 3
    jobs = _planned_jobs(_snakemake(pipeline["workdir"], config, "-n"))
    # the registered MLflow model carries the search settings too
    assert jobs == {
        "translate": 2, "score": 2, "register": 1, "attention_maps": 1, "report": 1, "all": 1,
        "total": 8,
    }  # fmt: skip


def test_changing_the_vocabulary_reruns_everything_after_cleaning(
    pipeline: dict[str, Any],
) -> None:
    config = copy.deepcopy(pipeline["config"])
    config["data"]["multi30k"]["en-de"]["vocab_size"] = 700
    jobs = _planned_jobs(_snakemake(pipeline["workdir"], config, "-n"))
    assert "download_multi30k" not in jobs and "prepare_multi30k_en_de" not in jobs
    assert jobs["spm_train"] == 1 and jobs["encode"] == 4 and jobs["train"] == 2
    assert jobs["translate"] == 3 and jobs["score"] == 3


STAGES = ("spm-train", "score")  # the stages that a lowercasing vocabulary changes


def test_a_lowercase_vocabulary_is_a_new_vocabulary_scored_case_insensitively(
    pipeline: dict[str, Any],
) -> None:
    """``lowercase: true``: spm-train lowercases, everything after it reruns, and every score
    job compares case-insensitively; the cased default passes the flag to no job, and setting
    it to false changes no job of a finished run."""
    config = copy.deepcopy(pipeline["config"])
    config["data"]["multi30k"]["en-de"]["lowercase"] = False
    assert _planned_jobs(_snakemake(pipeline["workdir"], config, "-n")) == {}
    commands = {}
    for lowercase in (False, True):
        config = copy.deepcopy(pipeline["config"])
        config["data"]["multi30k"]["en-de"]["vocab_size"] = 700  # a new vocabulary either way
        config["data"]["multi30k"]["en-de"]["lowercase"] = lowercase
        result = _snakemake(pipeline["workdir"], config, "-n")
        jobs = _planned_jobs(result)
        assert jobs["spm_train"] == 1 and jobs["train"] == 2 and jobs["score"] == 3
        found = re.findall(r"python -m transformer_nmt (\S+)(.*)", result.stdout + result.stderr)
        commands[lowercase] = [(stage, rest) for stage, rest in found if stage in STAGES]
        assert sorted(stage for stage, _ in commands[lowercase]) == ["score"] * 3 + ["spm-train"]
    assert not any("--lowercase" in rest for _, rest in commands[False])
    assert all("--lowercase" in rest.split() for _, rest in commands[True])


def test_moving_the_registry_or_editing_another_pair_reruns_nothing(
    pipeline: dict[str, Any],
) -> None:
    registry = yaml.safe_load((REPO_ROOT / "config" / "datasets.yaml").read_text(encoding="utf-8"))
    registry["multi30k"]["pairs"]["en-fr"]["splits"]["train"][0]["name"] = "renamed_corpus"
    moved = pipeline["workdir"] / "elsewhere" / "datasets.yaml"
    moved.parent.mkdir(exist_ok=True)
    moved.write_text(yaml.safe_dump(registry), encoding="utf-8")
    config = copy.deepcopy(pipeline["config"])
    config["registry"] = str(moved)
    assert _planned_jobs(_snakemake(pipeline["workdir"], config, "-n")) == {}
    # ... but a change to the en-de pair's entry re-runs its preparation and what follows.
    registry["multi30k"]["pairs"]["en-de"]["splits"]["train"][0]["name"] = "renamed_corpus"
    moved.write_text(yaml.safe_dump(registry), encoding="utf-8")
    jobs = _planned_jobs(_snakemake(pipeline["workdir"], config, "-n"))
    assert "download_multi30k" not in jobs and jobs["prepare_multi30k_en_de"] == 1


@pytest.fixture()
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 (a SQLite backend, proxied artifacts), as a cluster's login
    node would run it (docs/cluster.md, "MLflow on a cluster"); stopped after the test, and by
    ``timeout`` in any case."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = ["timeout", "900", str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
           "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"]  # fmt: skip
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed after the server)
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, server, tmp_path / "server.log", 120)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_a_tracking_server_named_in_the_config_receives_every_stage(
    pipeline: dict[str, Any], mlflow_server: str
) -> None:
    """``tracking_uri`` (config) sends every tracked stage of a run to an MLflow server, over
    the environment's store; switching stores is not a param, so it re-runs nothing."""
    from mlflow.tracking import MlflowClient

    wd: Path = pipeline["workdir"]
    config = {**pipeline["config"], "tracking_uri": mlflow_server}
    assert _planned_jobs(_snakemake(wd, config, "-n")) == {}
    name = "smoke_b"
    test_sets = config["experiments"][name]["test_sets"]
    targets = [f"results/runs/{name}/{t}.scores.json" for t in test_sets]
    targets.append(f"results/runs/{name}/mlflow_model.json")
    result = _snakemake(wd, config, "--forcerun", "train", "--", *targets)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert f"MLflow UI: open {mlflow_server}" in result.stdout + result.stderr

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("multi30k_en-de")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == name and run.info.status == "FINISHED"
    statuses = {k: v for k, v in run.data.tags.items() if re.match(r"stage\.[^.]+\.status$", k)}
    assert {
        "stage.train.status", "stage.average.status", "stage.select_alpha.status",
        "stage.register.status",
    } <= set(statuses)  # fmt: skip
    assert set(statuses.values()) == {"finished"}
    assert {f"{t}.bleu" for t in test_sets} <= set(run.data.metrics)
    scores = {a.path for a in client.list_artifacts(run.info.run_id, "scores")}
    assert scores == {f"scores/{t}.scores.json" for t in test_sets}  # through the server
    (model,) = client.search_registered_models()
    assert model.name == name
    record = json.loads((wd / "results" / "runs" / name / "mlflow_run.json").read_text())
    assert record["tracking_uri"] == mlflow_server and record["run_id"] == run.info.run_id
    # The environment's own store got nothing new.
    local = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    local_experiment = local.get_experiment_by_name("multi30k_en-de")
    local_runs = local.search_runs([local_experiment.experiment_id])
    assert sorted(r.info.run_name for r in local_runs) == ["smoke_a", "smoke_b"]
