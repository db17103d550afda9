"""The Table 3 study's DAG on CPU: a two-row slice of config/experiments/table3_cpu.yaml (rows
C1, scaled relative to the base, and E; two seeds each; the paired bootstrap against the base)
on a slice of Multi30k with a few steps, from the shared dataset mirror, up to the report; then
the report's sections (verdicts, the Δ BLEU figure), MLflow's nested seed runs and tables, and
the Snakemake report."""

from __future__ import annotations

import copy
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.test_workflow import _snakemake
from transformer_nmt.cli.info import count
from transformer_nmt.model.config import ModelConfig

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "config" / "experiments" / "table3_cpu.yaml"
REPORT = "results/report.md"
BASE = "t3cpu"
VERDICTS = {"holds", "holds (no difference)", "reverses", "no significant difference",
            "differs (paper: none)"}  # fmt: skip


def slice_config(mirror: Path) -> dict[str, Any]:
    """The study's config, two rows and two seeds each, cut to a few steps on 60 sentences."""
    config = copy.deepcopy(yaml.safe_load(CONFIG.read_text(encoding="utf-8")))
    config["data_mirror"] = str(mirror)
    config["data"]["multi30k"]["en-de"].update(vocab_size=600, clean={"max_sentences": 60})
    base = config["experiments"][BASE]
    base["train"].update(
        max_steps=10, tokens_per_update=200, max_tokens=1024, warmup=5, lr_cooldown_steps=None,
        checkpoint_every_steps=5, keep_checkpoints=2, val_every_steps=10,
        val_beam_bleu_every_steps=10, log_every_steps=5,
    )  # fmt: skip
    base.update(average_last_k=2, resources={"threads": 1, "mem_mb": 2000, "runtime": 10})
    base["translate"].update(beam=2, max_len_b=5)
    config["table3"].update(rows=["C1", "E"], seeds={"base": [1, 2], "C1": [1, 2], "E": [1, 2]})
    config["significance"]["resamples"] = 200
    return config


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, shared_mirror: Path) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("table3")
    config = slice_config(shared_mirror)
    result = _snakemake(workdir, config, "--", REPORT)  # target after the config file
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    text = (workdir / REPORT).read_text(encoding="utf-8")
    return {"workdir": workdir, "config": config, "report": text}


def _section(text: str, title: str) -> list[list[str]]:
    """The table rows (cells) of the report section whose heading starts with ``title``."""
    body = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in body.splitlines() if ln.startswith("| ") and "---" not in ln]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[1:]]


def test_table3_section_has_every_row_with_our_and_the_papers_values(study: dict) -> None:
    wd: Path = study["workdir"]
    rows = _section(study["report"], "Table 3")[:3]  # the first table: ours beside the paper's
    assert [r[0] for r in rows] == ["base", "C1", "E"]
    assert [r[1] for r in rows] == [BASE, f"{BASE}.C1", f"{BASE}.E"]
    by_row = {r[0]: r for r in rows}
    # paper's params / PPL / BLEU (Table 3) beside ours
    assert by_row["E"][4] == "65" and by_row["E"][6] == "4.92" and by_row["E"][10] == "25.7"
    # relative scale: the paper's N=2 of its 6 layers is 1 of the base's 3
    assert by_row["C1"][2] == "N=2 → ours: N=1" and by_row["E"][2] == "positional=learned"
    for cells in by_row.values():
        runs = [f"{cells[1]}.seed{s}" for s in (1, 2)]
        summaries = [
            json.loads((wd / "results" / "runs" / r / "train_summary.json").read_text())
            for r in runs
        ]
        for column, key in ((5, "val/ppl"), (9, "val/bleu_beam")):
            mean = sum(s["metrics"][key] for s in summaries) / 2
            assert cells[column].startswith(f"{mean:.2f} ± ")
        assert cells[13] == "10"  # the last validation's step: max_steps
        # our parameter count: the run's model with its vocabulary
        model = ModelConfig.from_dict(summaries[0]["model_config"])
        params = count(model, summaries[0]["vocab"]["size"])["parameters"]
        assert cells[3] == f"{params / 1e6:.2f}"
    # learned positions: two tables (source, target) of max_positions x d_model on top of base
    d_model = study["config"]["experiments"][BASE]["model_overrides"]["d_model"]
    extra = float(by_row["E"][3]) - float(by_row["base"][3])
    assert extra == pytest.approx(2 * 1024 * d_model / 1e6, abs=0.011)
    assert by_row["base"][7] == "+0.00"


def test_each_row_has_a_verdict_backed_by_its_paired_bootstrap(study: dict) -> None:
    wd: Path = study["workdir"]
    verdicts = {r[0]: r for r in _section(study["report"], "Table 3")[3:] if r[0] != "row"}
    assert set(verdicts) == {"C1", "E"}
    significance = {r[1]: r for r in _section(study["report"], "Significance")}
    for row, cells in verdicts.items():
        bleu, low, high = (float(x) for x in re.findall(r"-?\d+\.\d+", cells[1]))
        assert low <= high and cells[6] in VERDICTS
        # the same test as the significance section's, on the same test set
        assert cells[5] == f"{float(significance[f'{BASE}.{row}'][6]):.4f}"
        assert float(cells[3]) == pytest.approx(bleu - float(cells[2]), abs=0.011)
    assert re.search(r"The paper's finding holds for \d of 2 rows", study["report"])
    png = wd / "results" / "figures" / "table3_delta_bleu.png"
    assert png.is_file() and "](figures/table3_delta_bleu.png)" in study["report"]
    data = png.with_suffix(".csv").read_text().splitlines()
    assert data[0] == "row,delta_bleu,ci_low,ci_high,paper_delta_dev_bleu"
    assert [line.split(",")[0] for line in data[1:]] == ["C1", "E"]
    for line in data[1:]:  # the paired difference's interval holds the observed difference
        delta, low, high = (float(x) for x in line.split(",")[1:4])
        assert low <= delta <= high


def test_seed_and_significance_sections(study: dict) -> None:
    wd: Path = study["workdir"]
    seeds = {r[0]: r for r in _section(study["report"], "Seeds")}
    assert set(seeds) == {BASE, f"{BASE}.C1", f"{BASE}.E"}
    bleu = [
        json.loads((wd / "results" / "runs" / f"{BASE}.E.seed{s}" / "test_2016_flickr.scores.json")
                   .read_text())["bleu"]["score"] for s in (1, 2)
    ]  # fmt: skip
    assert seeds[f"{BASE}.E"][3] == ", ".join(f"{b:.2f}" for b in bleu)
    rows = _section(study["report"], "Significance")
    assert [r[1] for r in rows] == [f"{BASE} (baseline)", f"{BASE}.C1", f"{BASE}.E"]
    for cells in rows[1:]:
        low, high = (float(x) for x in re.findall(r"-?\d+\.\d+", cells[4]))
        assert cells[2] == "2" and low <= high and 0.0 < float(cells[6]) <= 1.0


def test_mlflow_nests_the_seed_runs_and_holds_the_tables(study: dict) -> None:
    from mlflow.tracking import MlflowClient

    wd: Path = study["workdir"]
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("multi30k_en-de")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    groups = (BASE, f"{BASE}.C1", f"{BASE}.E")
    # one run per seed, and per experiment a parent run (the report's)
    assert set(runs) == {*groups, *(f"{g}.seed{s}" for g in groups for s in (1, 2))}
    for group in groups:
        parent = runs[group]
        assert "test_2016_flickr.bleu_mean" in parent.data.metrics
        for seed in (1, 2):
            child = runs[f"{group}.seed{seed}"]
            assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
            tables = {a.path for a in client.list_artifacts(child.info.run_id, "tables")}
            assert tables == {"tables/table3.md", "tables/seeds.md", "tables/significance.md"}
    assert "test_2016_flickr.bleu_p_value" in runs[f"{BASE}.E"].data.metrics


def test_the_snakemake_report_has_the_study(study: dict) -> None:
    wd: Path = study["workdir"]
    result = _snakemake(wd, study["config"], "--report", str(wd / "report.zip"), "--", REPORT)
    assert result.returncode == 0, result.stderr[-3000:]
    with zipfile.ZipFile(wd / "report.zip") as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/report.md")]
        text = archive.read(name).decode("utf-8")
    assert "## Table 3" in text and "## Seeds" in text and "## Significance" in text
