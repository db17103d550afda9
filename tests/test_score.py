"""sacreBLEU scoring: primary detokenised BLEU/chrF and the paper-comparable tokenized BLEU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from transformer_nmt.cli import main
from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.score import (
    moses_tokenize,
    score_files,
    score_lines,
    split_compounds,
)
from transformer_nmt.io_utils import read_lines


def _write(path: Path, lines: list[str], final_newline: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    return path


def test_compound_splitting_matches_tensor2tensor_perl_regex() -> None:
    # Expected strings produced by: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert (
        split_compounds("a-b-c x - y 3.5-mal") == "a ##AT##-##AT## b-c x - y 3.5 ##AT##-##AT## mal"
    )


def test_moses_tokenization_splits_punctuation_and_escapes() -> None:
    assert moses_tokenize(['Ein "Test", oder?', "A & B"], "de") == [
        "Ein &quot; Test &quot; , oder ?",
        "A &amp; B",
    ]


def test_identical_text_scores_100_everywhere() -> None:
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee-Feld."]
    scores = score_lines(lines, lines, "de")
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        assert getattr(scores, key)["score"] == pytest.approx(100.0)
    assert scores.sentences == 2


def test_tokenized_bleu_matches_hand_computation() -> None:
    # One sentence, already tokenized: 1..4-gram precisions 4/5, 3/4, 2/3, 1/2, BP = 1.
    scores = score_lines(["a b c d e"], ["a b c d f"], "en")
    expected = 100 * math.exp(sum(math.log(p) for p in (4 / 5, 3 / 4, 2 / 3, 1 / 2)) / 4)
    assert scores.bleu_paper["score"] == pytest.approx(expected, abs=1e-6)
    assert scores.bleu_paper["precisions"] == pytest.approx([80.0, 75.0, 200 / 3, 50.0])
    assert scores.bleu_paper["bp"] == pytest.approx(1.0)
    # multi-bleu.perl has no smoothing: a missing 4-gram match gives 0.
    assert score_lines(["a b c x e"], ["a b c d e"], "en").bleu_paper["score"] == 0.0


def test_paper_bleu_uses_moses_tokens_and_compound_splitting() -> None:
    hyp = ["Das ist ein Hals-Nasen-Arzt , sagt er ."]
    ref = ["Das ist ein Hals-Nasen-Arzt, sagt er."]
    scores = score_lines(hyp, ref, "de")
    # After Moses tokenization both sides are identical.
    assert scores.bleu_paper["score"] == pytest.approx(100.0)
    assert scores.bleu_paper["sys_len"] == len(
        split_compounds(moses_tokenize(ref, "de")[0]).split()
    )
    assert "##AT##" in scores.bleu_paper["method"]
    assert "tok:none" in scores.bleu_paper["signature"]
    assert "smooth:none" in scores.bleu_paper["signature"]


def test_lowercased_tokenized_bleu_ignores_case_but_paper_bleu_does_not() -> None:
    hyp = ["EIN MANN SCHLÄFT AUF DER BANK ."]
    ref = ["ein Mann schläft auf der Bank."]
    scores = score_lines(hyp, ref, "de")
    assert scores.bleu_lc_tok["score"] == pytest.approx(100.0)
    assert "case:lc" in scores.bleu_lc_tok["signature"]
    assert scores.bleu_paper["score"] < 50.0


def test_lowercase_scores_equal_the_scores_of_lowercased_text() -> None:
    """``lowercase`` (a lowercasing vocabulary's output): every score is case-insensitive,
    the score of both sides lowercased, and the signatures say case:lc."""
    hyps = ["ein mann schläft auf der bank.", "zwei hunde rennen über die wiese."]
    refs = ["Ein Mann schläft auf einer Bank.", "Zwei Hunde laufen über die Wiese."]
    cased = score_lines(hyps, refs, "de", resamples=0)
    lowercase = score_lines(hyps, refs, "de", resamples=0, lowercase=True)
    lowered = score_lines(hyps, [r.lower() for r in refs], "de", resamples=0)
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        assert getattr(lowercase, key)["score"] == pytest.approx(getattr(lowered, key)["score"])
        assert "case:lc" in getattr(lowercase, key)["signature"]
    for key in ("bleu", "chrf", "bleu_paper"):
        assert getattr(cased, key)["score"] < getattr(lowercase, key)["score"]
        assert "case:mixed" in getattr(cased, key)["signature"]
    assert cased.bleu_lc_tok["score"] == lowercase.bleu_lc_tok["score"]


def test_primary_scores_carry_sacrebleu_signatures() -> None:
    scores = score_lines(["Der Hund rennt."], ["Der Hund läuft."], "de")
    assert "tok:13a" in scores.bleu["signature"] and "nrefs:1" in scores.bleu["signature"]
    assert scores.chrf["signature"].startswith("nrefs:1")
    assert 0.0 < scores.chrf["score"] < 100.0
    assert 0.0 <= scores.bleu["score"] < 100.0


def test_read_lines_handles_final_newline_and_crlf(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.txt", ["x", "y"], final_newline=False)
    b = tmp_path / "b.txt"
    b.write_bytes(b"x\r\ny\r\n")
    assert read_lines(a) == read_lines(b) == ["x", "y"]
    empty_line = _write(tmp_path / "c.txt", ["x", "", "y"])
    assert read_lines(empty_line) == ["x", "", "y"]


def test_line_count_mismatch_names_both_files(tmp_path: Path) -> None:
    hyp = _write(tmp_path / "t.hyp", ["a", "b"])
    ref = _write(tmp_path / "t.de", ["a", "b", "c"])
    with pytest.raises(DataError, match=r"t\.hyp has 2 lines but .*t\.de has 3 lines"):
        score_files(hyp, ref, "de")


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    hyp = tmp_path / "bad.hyp"
    hyp.write_bytes(b"ok\nalso ok\nbroken \xff here\n")
    ref = _write(tmp_path / "ref.de", ["ok", "also ok", "fine"])
    with pytest.raises(DataError, match=r"bad\.hyp:3: invalid UTF-8"):
        score_files(hyp, ref, "de")


def test_cli_writes_one_json_with_every_score(tmp_path: Path) -> None:
    hyp = _write(tmp_path / "test.hyp", ["Ein Mann fährt Rad.", "Eine Frau liest ein Buch."])
    ref = _write(tmp_path / "test.de", ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch."])
    out = tmp_path / "runs" / "test.scores.json"
    assert (
        main(["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de", "--out", str(out)])
        == 0
    )
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["sentences"] == 2 and data["tgt_lang"] == "de"
    assert data["hyp"] == str(hyp) and data["ref"] == str(ref)
    direct = score_files(hyp, ref, "de").to_dict()
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        assert data[key] == direct[key]
        assert 0.0 < data[key]["score"] < 100.0


def test_cli_lowercase_scores_case_insensitively_and_says_so(tmp_path: Path) -> None:
    hyp = _write(tmp_path / "test.hyp", ["ein mann fährt rad.", "eine frau liest ein buch."])
    ref = _write(tmp_path / "test.de", ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch."])
    outs = {flag: tmp_path / f"{flag or 'cased'}.scores.json" for flag in ("", "--lowercase")}
    for flag, out in outs.items():
        args = ["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de"]
        assert main([*args, *([flag] if flag else []), "--out", str(out)]) == 0
    cased, lowercase = (json.loads(out.read_text(encoding="utf-8")) for out in outs.values())
    assert cased["lowercase"] is False and lowercase["lowercase"] is True
    direct = score_files(hyp, ref, "de", lowercase=True).to_dict()
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        assert lowercase[key] == direct[key]
    assert "case:lc" in lowercase["bleu"]["signature"]
    assert cased["bleu"]["score"] < lowercase["bleu"]["score"]


def test_cli_mismatch_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hyp = _write(tmp_path / "x.hyp", ["a"])
    ref = _write(tmp_path / "x.de", ["a", "b"])
    out = tmp_path / "x.scores.json"
    assert (
        main(["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de", "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err
    assert "error: line count mismatch" in err and "x.hyp" in err and "x.de" in err
    assert not out.exists()
    assert set(tmp_path.iterdir()) == {hyp, ref}


def test_cli_logs_scores_into_the_experiments_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    hyp = _write(tmp_path / "h.txt", ["Ein Hund läuft.", "Zwei Kinder spielen."])
    ref = _write(tmp_path / "r.txt", ["Ein Hund rennt.", "Zwei Kinder spielen."])
    out = tmp_path / "runs" / "demo" / "test_2016_flickr.scores.json"
    args = ["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de", "--out", str(out)]
    assert main([*args, "--mlflow-experiment", "multi30k_en-de", "--mlflow-run", "demo"]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("multi30k_en-de")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "demo"
    assert run.data.metrics["test_2016_flickr.bleu"] == pytest.approx(data["bleu"]["score"])
    assert run.data.metrics["test_2016_flickr.bleu_paper"] == pytest.approx(
        data["bleu_paper"]["score"]
    )
    assert run.data.params["score.test_2016_flickr.tgt_lang"] == "de"
    assert run.data.tags["test_2016_flickr.bleu_signature"] == data["bleu"]["signature"]
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "scores")]
    assert artifacts == ["scores/test_2016_flickr.scores.json"]


def test_each_score_has_sacrebleus_own_bootstrap_interval() -> None:
    from sacrebleu.metrics import BLEU

    refs = [f"ein hund {w} im park nummer {i} ." for i, w in enumerate("läuft spielt sitzt" * 20)]
    hyps = [r if i % 3 else r.replace("park", "garten") for i, r in enumerate(refs)]
    scores = score_lines(hyps, refs, "de", resamples=200)
    # the interval is the one sacreBLEU computes itself (`sacrebleu --confidence`)
    own = BLEU().corpus_score(hyps, [refs], n_bootstrap=200)
    ci = scores.bleu["ci95"]
    assert ci["resamples"] == 200
    assert ci["mean"] == pytest.approx(own._mean)
    assert ci["high"] - ci["low"] == pytest.approx(2 * own._ci)
    assert "bs:200" in scores.bleu["signature"]
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        low, high = getattr(scores, key)["ci95"]["low"], getattr(scores, key)["ci95"]["high"]
        assert low < getattr(scores, key)["score"] < high
    # no resampling: no interval, and the plain signature
    plain = score_lines(hyps, refs, "de", resamples=0)
    assert "ci95" not in plain.bleu and "bs:" not in plain.bleu["signature"]
    assert plain.bleu["score"] == pytest.approx(scores.bleu["score"])


def test_cli_logs_the_intervals_into_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    refs = [f"Ein Hund Nummer {i} rennt im Park ." for i in range(30)]
    hyps = [r if i % 2 else r.replace("rennt", "läuft") for i, r in enumerate(refs)]
    hyp, ref = _write(tmp_path / "h.txt", hyps), _write(tmp_path / "r.txt", refs)
    # prepare's report beside the references names the dataset pair: the test set's raw files
    # (config/datasets.yaml) become the run's dataset inputs
    pair = {"dataset": "multi30k", "pair": "en-de"}
    (tmp_path / "clean_report.json").write_text(json.dumps(pair))
    monkeypatch.delenv("TRANSFORMER_NMT_REGISTRY", raising=False)
    monkeypatch.delenv("TRANSFORMER_NMT_MIRROR", raising=False)
    out = tmp_path / "runs" / "demo" / "test_2016_flickr.scores.json"
    args = ["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de", "--out", str(out)]
    tracking = ["--mlflow-experiment", "multi30k_en-de", "--mlflow-run", "demo"]
    assert main([*args, "--bootstrap-resamples", "100", *tracking]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("multi30k_en-de").experiment_id])
    metrics = run.data.metrics
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        ci, name = data[key]["ci95"], f"test_2016_flickr.{key}"
        assert metrics[f"{name}_ci95_low"] == pytest.approx(ci["low"])
        assert metrics[f"{name}_ci95_high"] == pytest.approx(ci["high"])
        assert metrics[f"{name}_ci95_low"] < metrics[name] < metrics[f"{name}_ci95_high"]
    assert "bs:100" in run.data.tags["test_2016_flickr.bleu_signature"]
    inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
    names = {i.dataset.name: {t.key: t.value for t in i.tags} for i in inputs}
    assert set(names) == {"multi30k/test_2016_flickr.en.gz", "multi30k/test_2016_flickr.de.gz"}
    assert {tags["mlflow.data.context"] for tags in names.values()} == {"test"}


def test_cli_refuses_a_negative_number_of_resamples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hyp, ref = _write(tmp_path / "h.txt", ["a"]), _write(tmp_path / "r.txt", ["a"])
    out = tmp_path / "x.scores.json"
    args = ["score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de", "--out", str(out)]
    assert main([*args, "--bootstrap-resamples", "-5"]) == 2
    assert "--bootstrap-resamples: -5 is negative" in capsys.readouterr().err
    assert not out.exists()


def test_an_almost_empty_translation_is_scored_with_its_intervals() -> None:
    # a barely trained model: all but one hypothesis empty. sacreBLEU 2.x's chrF then scores
    # resamples without a match as Python floats beside numpy float32s and its interval estimate
    # raises TypeError; the score stage must still write its scores
    refs = [f"ein hund läuft im park nummer {i} ." for i in range(150)]
    hyps = [""] * 149 + ["er."]
    scores = score_lines(hyps, refs, "de", resamples=200)
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        entry = getattr(scores, key)
        ci = entry["ci95"]
        assert ci["resamples"] == 200 and all(math.isfinite(ci[k]) for k in ("low", "high", "mean"))
        assert ci["low"] <= ci["mean"] <= ci["high"]  # sacreBLEU's: the draws' mean ± half
    assert scores.chrf["score"] < 1.0
    # the same draws each time (sacreBLEU's seed)
    assert score_lines(hyps, refs, "de", resamples=200).chrf == scores.chrf
