"""The report's figures: learning curves from metrics.csv, dev BLEU against averaged checkpoints,
the pair figure, their CSV data, the report's links, MLflow artifacts and bad input."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest

from transformer_nmt.cli import main
from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.figures import make_figures
from transformer_nmt.runs.layout import METRICS_FILE
from transformer_nmt.runs.metrics_history import (
    MetricsRow,
    append_metrics,
    read_metrics,
    write_metrics,
)
from transformer_nmt.runs.metrics_history import row as metrics_row

M30K = {"dataset": "multi30k", "pair": "en-de", "preset": "tiny"}


def _history(offset: float = 0.0) -> list[MetricsRow]:
    """Training rows every 5 steps, validations at 10 and 20 (BLEU measured at 20 only)."""
    rows = []
    for step in (5, 10, 15, 20):
        rows.append(metrics_row(step, 3.0 * step, {"train_loss": 6.0 - step / 10 + offset,
                                                   "lr": 1e-4 * step}))  # fmt: skip
        if step % 10 == 0:
            val = {"val_loss": 5.5 - step / 20 + offset, "val_ppl": 100.0 / step}
            if step == 20:
                val |= {"val_bleu": 3.25, "val_bleu_beam": 4.5}
            rows.append(metrics_row(step, 3.0 * step + 0.5, val))
    return rows


def _scores(run_dir: Path, test_set: str = "test_2016_flickr", bleu: float = 30.0) -> Path:
    path = run_dir / f"{test_set}.scores.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"sentences": 10, "bleu": {"score": bleu, "signature": "tok:13a"},
               "chrf": {"score": bleu, "signature": "nc:6"}, "bleu_paper": {"score": bleu},
               "bleu_lc_tok": {"score": bleu}}  # fmt: skip
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's signature and IHDR chunk (asserting both are there)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _floats(record: dict[str, str], keys: list[str]) -> dict[str, float]:
    return {k: float(record[k]) for k in keys if record[k] != ""}


def test_metrics_file_round_trips_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    rows = _history()
    write_metrics(path, rows[:-1])
    append_metrics(path, rows[-1])
    assert read_metrics(path) == rows  # exact: values are written with repr
    lines = path.read_text().splitlines()
    assert lines[0] == "step,elapsed_s,train_loss,lr,val_loss,val_ppl,val_bleu,val_bleu_beam"
    assert lines[3] == "10,30.5,,,5.0,10.0,,"  # a validation row: training cells empty

    path.write_text(path.read_text() + "25,80.0,4.")  # cut short by a kill: no newline
    assert read_metrics(path, drop_partial_last=True) == rows
    with pytest.raises(DataError, match=rf"{METRICS_FILE}:8: expected 8 columns, found 3"):
        read_metrics(path)
    path.write_text("\n".join(lines[:2] + ["15,x,1,1,,,,"]) + "\n")
    with pytest.raises(DataError, match=rf"{METRICS_FILE}:3: not a number"):
        read_metrics(path)
    path.write_text("step,loss\n1,2\n")
    with pytest.raises(DataError, match=rf"{METRICS_FILE}:1: expected the header step,elapsed_s"):
        read_metrics(path)
    with pytest.raises(DataError, match="missing.csv: file not found"):
        read_metrics(tmp_path / "missing.csv")


def test_learning_curves_and_averaging_figures_hold_their_data(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "m30k"
    run.mkdir(parents=True)
    rows = _history()
    write_metrics(run / METRICS_FILE, rows)
    selection = {"best_k": 5, "dev_bleu": {"1": 30.5, "10": 31.0, "5": 31.25}, "step": 20}
    (run / "average_selection.json").write_text(json.dumps(selection))

    figures = make_figures({"m30k": run}, {"m30k": M30K}, tmp_path / "figures")
    curves, averaging = figures.runs["m30k"]
    assert curves.png == tmp_path / "figures" / "runs" / "m30k" / "learning_curves.png"
    assert averaging.png.name == "bleu_vs_averaged_checkpoints.png"
    for fig in (curves, averaging):
        width, height = _png_size(fig.png)
        assert width > 200 and height > 200
        assert fig.csv == fig.png.with_suffix(".csv")
    data = _csv(curves.csv)
    values = ["train_loss", "lr", "val_loss", "val_ppl", "val_bleu", "val_bleu_beam"]
    assert [(int(r["step"]), float(r["elapsed_s"]), _floats(r, values)) for r in data] == [
        (r.step, r.elapsed_s, r.values) for r in rows
    ]
    assert [float(r["minutes"]) for r in data] == [r.elapsed_s / 60 for r in rows]
    assert _csv(averaging.csv) == [
        {"k": "1", "dev_bleu": "30.5", "chosen": "0"},
        {"k": "5", "dev_bleu": "31.25", "chosen": "1"},
        {"k": "10", "dev_bleu": "31.0", "chosen": "0"},
    ]
    assert figures.pairs == {} and figures.notes["m30k"] == []  # one experiment: no pair figure


def test_experiments_of_one_pair_share_a_figure_and_missing_inputs_are_noted(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    for name, offset in (("a", 0.0), ("b", 0.5)):
        (runs / name).mkdir(parents=True)
        write_metrics(runs / name / METRICS_FILE, _history(offset))
    (runs / "old").mkdir()  # trained before metrics.csv existed; averaged a fixed K
    experiments = {"a": M30K, "b": M30K, "old": M30K}
    figures = make_figures({n: runs / n for n in experiments}, experiments, tmp_path / "fig")
    pair = figures.pairs["multi30k_en-de"]
    assert pair.experiments == ("a", "b")  # "old" has no history to draw
    assert _png_size(pair.png)[0] > 200
    data = _csv(pair.csv)
    assert [r["experiment"] for r in data] == ["a"] * 6 + ["b"] * 6
    assert [float(r["train_loss"]) for r in data if r["experiment"] == "b" and r["train_loss"]] == [
        r.values["train_loss"] for r in _history(0.5) if "train_loss" in r.values
    ]
    assert figures.runs["old"] == []
    notes = figures.notes["old"]
    assert len(notes) == 2 and "no learning curves" in notes[0] and "fixed number" in notes[1]


def test_report_embeds_the_figures_and_other_stages_pngs(tmp_path: Path) -> None:
    runs = tmp_path / "results" / "runs"
    scores = [_scores(runs / "a"), _scores(runs / "b")]
    for name in ("a", "b"):
        write_metrics(runs / name / METRICS_FILE, _history())
    # another stage's figure beside run a (e.g. an attention map)
    (runs / "a" / "figures").mkdir()
    (runs / "a" / "figures" / "attention_0.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "results" / "report.md"
    experiments = json.dumps({"a": M30K, "b": M30K})
    argv = ["report", "--scores", *map(str, scores), "--out", str(out), "--experiments",
            experiments, "--figures-dir", str(tmp_path / "results" / "figures")]  # fmt: skip
    assert main(argv) == 0
    text = out.read_text(encoding="utf-8")
    assert "## Figures" in text and "### multi30k_en-de: a, b" in text
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert links == [
        "figures/runs/a/learning_curves.png",
        "runs/a/figures/attention_0.png",
        "figures/runs/b/learning_curves.png",
        "figures/pairs/multi30k_en-de/learning_curves.png",
    ]
    for link in links:
        assert (out.parent / link).is_file()  # relative to the report
    assert "([data](figures/runs/a/learning_curves.csv))" in text


def test_corrupt_metrics_file_is_one_line_error_and_no_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scores = _scores(tmp_path / "runs" / "a")
    (scores.parent / METRICS_FILE).write_text("step,elapsed_s\n")
    out = tmp_path / "report.md"
    argv = ["report", "--scores", str(scores), "--out", str(out), "--figures-dir",
            str(tmp_path / "figures")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and f"{METRICS_FILE}:1: expected the header" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_figures_are_mlflow_artifacts_of_each_experiments_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    runs = tmp_path / "runs"
    scores = [_scores(runs / "a"), _scores(runs / "b")]
    for name in ("a", "b"):
        write_metrics(runs / name / METRICS_FILE, _history())
    (runs / "a" / "average_selection.json").write_text(
        json.dumps({"best_k": 1, "dev_bleu": {"1": 2.0}})
    )
    argv = ["report", "--scores", *map(str, scores), "--out", str(tmp_path / "report.md"),
            "--experiments", json.dumps({"a": M30K, "b": M30K}), "--figures-dir",
            str(tmp_path / "figures"), "--mlflow"]  # fmt: skip
    assert main(argv) == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("multi30k_en-de")
    found = {}
    for run in client.search_runs([experiment.experiment_id]):
        paths = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
        pair = {a.path for a in client.list_artifacts(run.info.run_id, "figures/multi30k_en-de")}
        found[run.info.run_name] = paths | pair
    shared = {"figures/learning_curves.png", "figures/learning_curves.csv",
              "figures/multi30k_en-de", "figures/multi30k_en-de/learning_curves.png",
              "figures/multi30k_en-de/learning_curves.csv"}  # fmt: skip
    assert found == {
        "a": shared
        | {
            "figures/bleu_vs_averaged_checkpoints.png",
            "figures/bleu_vs_averaged_checkpoints.csv",
        },  # fmt: skip
        "b": shared,
    }
