"""The results report: rows per experiment × test set, the paper's Table 2 beside WMT14 rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_nmt.cli import main
from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.report import PAPER_TABLE2, read_report, run_summary

EXPERIMENTS = {
    "wmt_big": {"dataset": "wmt14_en_de", "pair": "en-de", "preset": "big"},
    "wmt_fr_base": {"dataset": "wmt14_en_fr", "pair": "en-fr", "preset": "base"},
    "m30k": {"dataset": "multi30k", "pair": "en-de", "preset": "tiny"},
}


def _scores(run_dir: Path, test_set: str, bleu: float, n: int = 100) -> Path:
    path = run_dir / f"{test_set}.scores.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "sentences": n,
        "bleu": {"score": bleu, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"},
        "chrf": {"score": bleu + 20, "signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0"},
        "bleu_paper": {"score": bleu + 1, "signature": "tok:none"},
        "bleu_lc_tok": {"score": bleu + 2, "signature": "case:lc|tok:none"},
    }
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def _table_rows(text: str) -> list[list[str]]:
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| exp")]
    return [[cell.strip() for cell in ln.strip("|").split("|")] for ln in rows]


def test_table2_numbers_are_the_papers() -> None:
    assert PAPER_TABLE2 == {
        ("wmt14_en_de", "en-de", "base"): 27.3,
        ("wmt14_en_de", "en-de", "big"): 28.4,
        ("wmt14_en_fr", "en-fr", "base"): 38.1,
        ("wmt14_en_fr", "en-fr", "big"): 41.8,
    }


def test_rows_sorted_with_scores_and_paper_numbers_only_on_wmt14_test(tmp_path: Path) -> None:
    runs = tmp_path / "results" / "runs"
    paths = [
        _scores(runs / "wmt_big", "newstest2014", 26.5, n=3003),
        _scores(runs / "m30k", "test_2017_flickr", 30.0),
        _scores(runs / "m30k", "test_2016_flickr", 35.25),
        _scores(runs / "wmt_big", "newstest2013", 25.0, n=3000),
        _scores(runs / "wmt_fr_base", "newstest2014", 37.0, n=3003),
    ]
    text = read_report(paths, EXPERIMENTS).markdown()
    rows = _table_rows(text)
    assert [(r[0], r[3]) for r in rows] == [
        ("m30k", "test_2016_flickr"),
        ("m30k", "test_2017_flickr"),
        ("wmt_big", "newstest2013"),
        ("wmt_big", "newstest2014"),
        ("wmt_fr_base", "newstest2014"),
    ]
    # columns: experiment, data, preset, test set, sentences, BLEU, chrF, tok BLEU, paper, lc
    assert rows[0][1:] == ["multi30k en-de", "tiny", "test_2016_flickr", "100", "35.25", "55.25",
                           "36.25", "—", "37.25", "—"]  # fmt: skip
    assert rows[2][8] == "—"  # newstest2013 is the dev set: no paper number
    assert rows[3][4] == "3003" and rows[3][8] == "28.40"
    assert rows[4][8] == "38.10"
    assert "`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp`" in text
    assert "`nrefs:1|case:mixed|eff:yes|nc:6|nw:0`" in text


def test_unknown_experiment_is_reported_without_paper_number(tmp_path: Path) -> None:
    path = _scores(tmp_path / "other", "newstest2014", 20.0)
    rows = _table_rows(read_report([path], {}).markdown())
    assert rows == [["other", "—", "—", "newstest2014", "100", "20.00", "40.00", "21.00", "—",
                     "22.00", "—"]]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not valid JSON"),
        ('{"sentences": 3, "bleu": {"score": 1}}', r"missing key 'chrf'"),
        (
            '{"sentences": 3, "bleu": {"score": "x"}, "chrf": {}, "bleu_paper": {}, '
            '"bleu_lc_tok": {}}',
            r"key 'bleu' has no numeric 'score'",
        ),
    ],
)
def test_malformed_scores_file_names_file_and_key(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "exp" / "test.scores.json"
    path.parent.mkdir()
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=rf"test\.scores\.json: {message}"):
        read_report([path], {}).markdown()


def test_cli_writes_report_and_fails_cleanly(tmp_path: Path) -> None:
    good = _scores(tmp_path / "runs" / "wmt_big", "newstest2014", 27.0)
    out = tmp_path / "report.md"
    experiments = json.dumps(EXPERIMENTS)
    args = ["report", "--scores", str(good), "--out", str(out), "--experiments", experiments]
    assert main(args) == 0
    assert _table_rows(out.read_text(encoding="utf-8"))[0][8] == "28.40"

    out2 = tmp_path / "report2.md"
    assert main(["report", "--scores", str(good), "--out", str(out2), "--experiments", "[1]"]) == 2
    missing = tmp_path / "runs" / "x" / "missing.scores.json"
    assert main(["report", "--scores", str(missing), "--out", str(out2)]) == 2
    assert not out2.exists()


def test_cli_logs_the_report_into_every_experiments_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    paths = [
        _scores(tmp_path / "runs" / "wmt_big", "newstest2014", 27.0),
        _scores(tmp_path / "runs" / "m30k", "test_2016_flickr", 30.0),
    ]
    out = tmp_path / "report.md"
    experiments = {k: EXPERIMENTS[k] for k in ("wmt_big", "m30k")}
    args = ["report", "--scores", *map(str, paths), "--out", str(out)]
    assert main([*args, "--experiments", json.dumps(experiments), "--mlflow"]) == 0
    client = MlflowClient(tracking_uri=uri)
    for name, info in experiments.items():
        experiment = client.get_experiment_by_name(f"{info['dataset']}_{info['pair']}")
        (run,) = client.search_runs([experiment.experiment_id])
        assert run.info.run_name == name
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.md"]


def test_a_recipe_report_keeps_every_experiment_under_the_runs_dir(tmp_path: Path) -> None:
    """The demo ran first (its report recorded what m30k is); a recipe's report then lists both."""
    runs = tmp_path / "runs"
    demo = _scores(runs / "m30k", "test_2016_flickr", 31.0)
    demo_only = {"m30k": EXPERIMENTS["m30k"]}
    args = ["report", "--scores", str(demo), "--out", str(tmp_path / "demo.md")]
    assert main([*args, "--experiments", json.dumps(demo_only), "--runs-dir", str(runs)]) == 0
    assert json.loads((runs / "m30k" / "experiment.json").read_text()) == EXPERIMENTS["m30k"]

    recipe = _scores(runs / "wmt_big", "newstest2014", 27.0)
    recipe_only = {"wmt_big": EXPERIMENTS["wmt_big"]}
    out = tmp_path / "report.md"
    args = ["report", "--scores", str(recipe), "--out", str(out), "--runs-dir", str(runs)]
    assert main([*args, "--experiments", json.dumps(recipe_only)]) == 0
    rows = _table_rows(out.read_text(encoding="utf-8"))
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [
        ("m30k", "multi30k en-de", "tiny", "31.00"),  # the demo's row, with what it is
        ("wmt_big", "wmt14_en_de en-de", "big", "27.00"),
    ]


def test_dev_set_choice_of_averaged_checkpoints_is_in_the_report(tmp_path: Path) -> None:
    path = _scores(tmp_path / "runs" / "m30k", "test_2016_flickr", 31.0)
    selection = {"best_k": 5, "dev_bleu": {"1": 30.5, "10": 31.0, "5": 31.25}}
    (path.parent / "average_selection.json").write_text(json.dumps(selection))
    text = read_report([path], EXPERIMENTS).markdown()
    assert "## Checkpoint averaging chosen on the dev set" in text
    assert "| m30k | 1: 30.50, 5: 31.25, 10: 31.00 | 5 |" in text


def test_train_overlap_from_the_cleaning_report_is_beside_each_score(tmp_path: Path) -> None:
    results = tmp_path / "results"
    paths = [
        _scores(results / "runs" / "m30k", "test_2016_flickr", 35.0, n=1000),
        _scores(results / "runs" / "m30k", "test_2017_flickr", 30.0, n=1000),
    ]
    clean = results / "data" / "multi30k" / "en-de" / "clean_report.json"
    clean.parent.mkdir(parents=True)
    overlap = {"sentences": 1000, "source": 30, "target": 25, "pair": 12, "lines": {}}
    splits = {"train": {"read": 5}, "test_2016_flickr": {"train_overlap": overlap},
              "test_2017_flickr": {"kept": 1000}}  # fmt: skip
    clean.write_text(json.dumps({"splits": splits}), encoding="utf-8")
    rows = _table_rows(read_report(paths, EXPERIMENTS).markdown())
    assert [r[-1] for r in rows] == ["pair 12/1000 (src 30, tgt 25)", "—"]
    splits["test_2016_flickr"]["train_overlap"] = {"sentences": 1000}
    clean.write_text(json.dumps({"splits": splits}), encoding="utf-8")
    with pytest.raises(DataError, match=r"clean_report.json: no train_overlap for test_2016"):
        read_report(paths, EXPERIMENTS).markdown()


def test_each_score_is_shown_with_its_bootstrap_interval_in_report_csv_and_landing_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv
    from types import SimpleNamespace

    from docutils.core import publish_parts
    from jinja2 import Environment

    refs = [f"Ein Hund Nummer {i} rennt im Park ." for i in range(40)]
    hyps = [r if i % 3 else r.replace("rennt", "läuft") for i, r in enumerate(refs)]
    (tmp_path / "h.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    scores = tmp_path / "results" / "runs" / "m30k" / "test_2016_flickr.scores.json"
    hyp_ref = ["--hyp", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "r.txt")]
    assert main(["score", *hyp_ref, "--tgt-lang", "de", "--out", str(scores)]) == 0
    data = json.loads(scores.read_text(encoding="utf-8"))
    bleu, ci = data["bleu"]["score"], data["bleu"]["ci95"]
    cell = f"{bleu:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"

    out, table = tmp_path / "results" / "report.md", tmp_path / "results" / "report_table.csv"
    experiments = json.dumps({"m30k": EXPERIMENTS["m30k"]})
    args = ["report", "--scores", str(scores), "--out", str(out), "--table-csv", str(table)]
    assert main([*args, "--experiments", experiments]) == 0
    text = out.read_text(encoding="utf-8")
    (row,) = _table_rows(text)
    assert row[5] == cell and "95% CI" in text
    assert "`make ui` (or `python -m transformer_nmt ui`)" in text  # where the MLflow runs are
    chrf = data["chrf"]
    assert row[6] == f"{chrf['score']:.2f} [{chrf['ci95']['low']:.2f}, {chrf['ci95']['high']:.2f}]"
    header, csv_row = list(csv.reader(table.read_text(encoding="utf-8").splitlines()))
    assert header[5] == "BLEU [95% CI]" and csv_row == row

    # The Snakemake report's landing page (workflow/report/workflow.rst, rendered as Snakemake
    # renders it: Jinja with the report's files, then docutils) shows the table.
    monkeypatch.chdir(tmp_path)
    rst = (Path(__file__).parent.parent / "workflow" / "report" / "workflow.rst").read_text()
    files = [SimpleNamespace(target="report_table.csv", path=Path("results/report_table.csv"))]
    html = publish_parts(Environment().from_string(rst).render(files=files), writer="html")
    assert f"<td>{cell}</td>" in html["html_body"]
    empty = publish_parts(Environment().from_string(rst).render(files=[]), writer="html")
    assert "<table" not in empty["html_body"]


def test_a_malformed_interval_names_the_file_and_how_to_recover(tmp_path: Path) -> None:
    path = _scores(tmp_path / "m30k", "test", 30.0)
    data = json.loads(path.read_text())
    data["bleu"]["ci95"] = {"low": "x"}
    path.write_text(json.dumps(data))
    message = r"test\.scores\.json: 'bleu\.ci95' needs .*re-run the score"
    with pytest.raises(DataError, match=message):
        read_report([path], {}).markdown()


def test_the_length_penalty_chosen_on_dev_is_in_the_report_only_for_alpha_auto(
    tmp_path: Path,
) -> None:
    path = _scores(tmp_path / "runs" / "m30k", "test_2016_flickr", 31.0)
    chosen = {"best_alpha": 1.2, "dev_bleu": {"0.6": 30.1, "1.2": 30.9, "1": 30.5}}
    (path.parent / "alpha_selection.json").write_text(json.dumps(chosen))
    auto = {name: {**info, "alpha": "auto"} for name, info in EXPERIMENTS.items()}
    text = read_report([path], auto).markdown()
    assert "## Length penalty chosen on the dev set" in text
    assert "| m30k | 0.6: 30.10, 1: 30.50, 1.2: 30.90 | 1.2 |" in text
    # a fixed α (the file is left from an earlier alpha: auto run): no such section
    fixed = {name: {**info, "alpha": 0.6} for name, info in EXPERIMENTS.items()}
    assert "Length penalty chosen" not in read_report([path], fixed).markdown()


def test_the_run_summary_names_each_score_with_its_interval_the_report_and_the_ui(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "results" / "runs"
    with_ci = _scores(runs / "multi30k_en_de_tiny", "test_2016_flickr", 35.5)
    data = json.loads(with_ci.read_text())
    data["bleu"]["ci95"] = {"low": 34.12, "high": 36.875, "mean": 35.4, "resamples": 1000}
    with_ci.write_text(json.dumps(data))
    bare = _scores(runs / "m30k", "test_2017_flickr", 27.0)  # no interval (resamples 0)
    missing = runs / "m30k" / "test_2016_flickr.scores.json"
    report = tmp_path / "results" / "report.md"
    report.write_text("# Results\n")
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    text = run_summary([with_ci, bare, missing], report, f"sqlite:///{store}")
    assert text.splitlines() == [
        "sacreBLEU [95% bootstrap interval]:",
        "  multi30k_en_de_tiny  test_2016_flickr  35.50 [34.12, 36.88]",
        "  m30k                 test_2017_flickr  27.00",
        f"report: {report}",
        f"MLflow UI: MLFLOW_TRACKING_URI=sqlite:///{store} python -m transformer_nmt ui",
    ]
    # a tracking server: its address; a run stopped before scoring: only what exists
    assert run_summary([missing], tmp_path / "none.md", "http://login:5000") == (
        "MLflow UI: open http://login:5000"
    )
    assert run_summary([missing], tmp_path / "none.md", f"sqlite:///{tmp_path}/no.db") == ""
    # a scores file that cannot be read is a line naming it, not an error ending the run
    bare.write_text("{")
    assert f"  {bare}: not valid JSON" in run_summary([bare], report, "http://h:1")
