"""The Table 3 study's DAG, CPU-sized (.test/config/table3.yaml): a scaled-down base, two rows,
two seeds each and the paired bootstrap, from the shared dataset mirror, up to the report; then
the report's sections, MLflow's nested seed runs and tables, and the Snakemake report."""

from __future__ import annotations

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

CONFIG = REPO_ROOT / ".test" / "config" / "table3.yaml"
REPORT = "results/report.md"


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, shared_mirror: Path) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("table3")
    config = {
        **yaml.safe_load(CONFIG.read_text(encoding="utf-8")),
        "data_mirror": str(shared_mirror),
    }
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
    rows = _section(study["report"], "Table 3")
    assert [r[0] for r in rows] == ["base", "D3", "E"]
    assert [r[1] for r in rows] == ["t3", "t3.D3", "t3.E"]
    by_row = {r[0]: r for r in rows}
    # paper's params / PPL / BLEU (Table 3) beside ours
    assert by_row["E"][4] == "65" and by_row["E"][6] == "4.92" and by_row["E"][10] == "25.7"
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
    extra = float(by_row["E"][3]) - float(by_row["base"][3])
    assert extra == pytest.approx(2 * 1024 * 64 / 1e6, abs=0.011)
    assert by_row["D3"][3] == by_row["base"][3] and by_row["base"][7] == "+0.00"


def test_seed_and_significance_sections(study: dict) -> None:
    wd: Path = study["workdir"]
    seeds = {r[0]: r for r in _section(study["report"], "Seeds")}
    assert set(seeds) == {"t3", "t3.D3", "t3.E"}
    bleu = [
        json.loads((wd / "results" / "runs" / f"t3.E.seed{s}" / "test_2016_flickr.scores.json")
                   .read_text())["bleu"]["score"] for s in (1, 2)
    ]  # fmt: skip
    assert seeds["t3.E"][3] == ", ".join(f"{b:.2f}" for b in bleu)
    rows = _section(study["report"], "Significance")
    assert [r[1] for r in rows] == ["t3 (baseline)", "t3.D3", "t3.E"]
    for cells in rows[1:]:
        low, high = (float(x) for x in re.findall(r"-?\d+\.\d+", cells[4]))
        assert cells[2] == "2" and low <= high and 0.0 < float(cells[6]) <= 1.0


def test_mlflow_nests_the_seed_runs_and_holds_the_tables(study: dict) -> None:
    from mlflow.tracking import MlflowClient

    wd: Path = study["workdir"]
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("multi30k_en-de")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    groups = ("t3", "t3.D3", "t3.E")
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
    assert "test_2016_flickr.bleu_p_value" in runs["t3.E"].data.metrics


def test_the_snakemake_report_has_the_study(study: dict) -> None:
    wd: Path = study["workdir"]
    result = _snakemake(wd, study["config"], "--report", str(wd / "report.zip"), "--", REPORT)
    assert result.returncode == 0, result.stderr[-3000:]
    with zipfile.ZipFile(wd / "report.zip") as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/report.md")]
        text = archive.read(name).decode("utf-8")
    assert "## Table 3" in text and "## Seeds" in text and "## Significance" in text
