"""A user's own corpus (config ``datasets:``, data/local.py): declared by local paths, checked
before any job, carved into disjoint splits, scored for any target language; and the whole DAG
on two small corpora built here (a TSV with carved splits; file pairs in a non-Latin script).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT, checkout_pythonpath, snakemake_command
from transformer_nmt.cli import main
from transformer_nmt.data.clean import CleanConfig
from transformer_nmt.data.download import download_dataset
from transformer_nmt.data.local import check_pair, merged_registry, registry_entry
from transformer_nmt.data.prepare import prepare_pair
from transformer_nmt.data.registry import parse_registry
from transformer_nmt.data.splits import overlap_key
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.evaluation.report import load_row, table_cells
from transformer_nmt.evaluation.score import bleu_tokenizer, score_lines, tokenizer_available
from transformer_nmt.languages import character_coverage

# --- corpora built by the tests ---------------------------------------------------------------


def _multi30k(mirror: Path, split: str, lang: str, n: int) -> list[str]:
    with gzip.open(mirror / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f, strict=False)]


def _write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


# A synthetic script for the target side: German letters mapped onto CJK ideographs (one
# character per letter, spaces dropped as Chinese writes no spaces): no data is downloaded,
# and the text needs what a CJK language needs (character coverage, BLEU's zh tokenizer).
_LETTERS = "abcdefghijklmnopqrstuvwxyzäöüß"
_SCRIPT = {c: chr(0x4E00 + 37 * i) for i, c in enumerate(_LETTERS)}


def _to_script(line: str) -> str:
    return "".join(_SCRIPT.get(c, c) for c in line.lower() if c != " ")


def _dataset(raw: dict[str, Any], name: str = "own", base: Path | None = None) -> Any:
    entry = registry_entry(name, raw, base or Path("."))
    return parse_registry({name: entry}, "test")[name]


# --- declaring a dataset ----------------------------------------------------------------------


def test_each_corpus_form_becomes_registry_files_and_sides(tmp_path: Path) -> None:
    _write_tsv(tmp_path / "web.tsv", [("a", "b")])
    (tmp_path / "news.en").write_text("a\n", encoding="utf-8")
    with gzip.open(tmp_path / "news.sw.gz", "wt", encoding="utf-8") as f:
        f.write("b\n")
    (tmp_path / "x.en").write_text("a\n", encoding="utf-8")
    (tmp_path / "y.sw").write_text("b\n", encoding="utf-8")
    (tmp_path / "other").mkdir()
    _write_tsv(tmp_path / "other" / "web.tsv", [("c", "d")])
    raw = {
        "pair": "en-sw",
        "train": ["web.tsv", "news", "other/web.tsv"],
        "valid": {"en": "x.en", "sw": "y.sw"},
        "test": {"news_test": 3, "web_test": "news"},
        "seed": 7,
    }
    dataset = _dataset(raw, base=tmp_path)
    pair = dataset.pair("en-sw")
    assert dataset.local and dataset.test_splits == ["news_test", "web_test"]
    assert pair.carve == {"news_test": 3} and pair.carve_seed == 7
    assert pair.split_names() == ["train", "valid", "web_test", "news_test"]
    web, news, web2 = pair.splits["train"]
    assert (web.name, news.name, web2.name) == ("web", "news", "web_2")  # unique corpus names
    assert (web.sides["en"].format, web.sides["en"].column, web.sides["sw"].column) == (
        "tsv", 0, 1,
    )  # fmt: skip
    assert news.sides["en"].format == "text" and news.sides["sw"].format == "gzip"
    files = dataset.files
    assert files[web.sides["en"].file].path == str(tmp_path / "web.tsv")
    assert files[web2.sides["en"].file].path == str(tmp_path / "other" / "web.tsv")
    assert web.sides["en"].file != web2.sides["en"].file  # same basename, two files
    assert files[news.sides["sw"].file].url == (tmp_path / "news.sw.gz").as_uri()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"pair": "en-sw", "train": "missing.tsv", "valid": 1, "test": 1},
         r"datasets\.own\.train\[0\]: .*missing\.tsv does not exist"),
        ({"pair": "en-sw", "train": "nothing", "valid": 1, "test": 1},
         r"datasets\.own\.train\[0\]: neither .*nothing\.en nor .*nothing\.en\.gz exists"),
        ({"pair": "en-sw", "train": "c.tsv", "valid": 0, "test": 1},
         r"datasets\.own\.valid: carve at least 1 pair"),
        ({"pair": "en-sw", "train": "c.tsv", "valid": 1}, r"missing key\(s\) \['test'\]"),
        ({"pair": "en-sw", "train": "c.tsv", "valid": 1, "test": 1, "tset": 1},
         r"unknown key\(s\) \['tset'\]"),
        ({"pair": "en-sw", "train": 5, "valid": 1, "test": 1},
         r"datasets\.own\.train\[0\]: expected"),
    ],
)  # fmt: skip
def test_a_bad_dataset_block_names_its_key(tmp_path: Path, raw: dict, message: str) -> None:
    _write_tsv(tmp_path / "c.tsv", [("a", "b")])
    with pytest.raises(ConfigError, match=message):
        registry_entry("own", raw, tmp_path)


def test_a_name_the_registry_has_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"datasets\.multi30k: the dataset registry already"):
        merged_registry({"multi30k": {}}, {"multi30k": {"pair": "en-de"}})


# --- checks before any job --------------------------------------------------------------------


def _linked(tmp_path: Path, raw: dict[str, Any]) -> tuple[Any, Path]:
    dataset = _dataset(raw, base=tmp_path)
    raw_dir = tmp_path / "resources"
    download_dataset(dataset, raw_dir)
    return dataset, raw_dir


def _pairs(n: int, offset: int = 0) -> list[tuple[str, str]]:
    return [(f"source sentence {i}", f"target sentence {i}") for i in range(offset, offset + n)]


def test_files_are_linked_in_place_and_hashed(tmp_path: Path) -> None:
    tsv = _write_tsv(tmp_path / "c.tsv", _pairs(20))
    dataset, raw_dir = _linked(tmp_path, {"pair": "en-sw", "train": "c.tsv", "valid": 2, "test": 2})
    link = raw_dir / "c.tsv"
    assert link.is_symlink() and link.resolve() == tsv
    import hashlib

    lock = json.loads((raw_dir / "checksums.lock.json").read_text())
    assert lock == {"c.tsv": hashlib.sha256(tsv.read_bytes()).hexdigest()}
    summary = check_pair(dataset, "en-sw", raw_dir, CleanConfig())
    assert summary["splits"] == {"train": 20} and summary["distinct_train_pairs"] == 20
    tsv.write_text(tsv.read_text() + "more\tlines\n")  # an edited corpus is pinned afresh
    download_dataset(dataset, raw_dir)
    assert json.loads((raw_dir / "checksums.lock.json").read_text())["c.tsv"] != lock["c.tsv"]


def test_unequal_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    (tmp_path / "t.en").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "t.sw").write_text("x\ny\n", encoding="utf-8")
    dataset, raw_dir = _linked(tmp_path, {"pair": "en-sw", "train": "t", "valid": 1, "test": 1})
    with pytest.raises(
        DataError, match=rf"{tmp_path}/t\.sw has 2 lines but {tmp_path}/t\.en has 3"
    ):
        check_pair(dataset, "en-sw", raw_dir, CleanConfig())


@pytest.mark.parametrize("line", ["no tab here", "one\ttab\ttoo many"])
def test_a_tsv_line_without_exactly_one_tab_names_file_and_line(tmp_path: Path, line: str) -> None:
    tsv = tmp_path / "c.tsv"
    tsv.write_text("a\tb\nc\td\n" + line + "\n", encoding="utf-8")
    dataset, raw_dir = _linked(tmp_path, {"pair": "en-sw", "train": "c.tsv", "valid": 1, "test": 1})
    with pytest.raises(DataError, match=rf"{tsv}: line 3: expected source<TAB>target \(one tab\)"):
        check_pair(dataset, "en-sw", raw_dir, CleanConfig())


@pytest.mark.parametrize(("bad", "kind"), [(b"\t\n", "empty side"), (b"\xff\xfe\tx\n", "UTF-8")])
def test_empty_or_undecodable_lines_beyond_the_cleaning_share_stop(
    tmp_path: Path, bad: bytes, kind: str
) -> None:
    good = "".join(f"s{i}\tt{i}\n" for i in range(98)).encode()
    (tmp_path / "c.tsv").write_bytes(good + bad * 2)  # 2 of 100 pairs: 2 % > 1 % (default)
    dataset, raw_dir = _linked(tmp_path, {"pair": "en-sw", "train": "c.tsv", "valid": 1, "test": 1})
    with pytest.raises(DataError, match=r"2 of the 100 pairs .* the first at line 99.*max_invalid"):
        check_pair(dataset, "en-sw", raw_dir, CleanConfig())
    # within the share (here 5 %): the pairs are counted, and cleaning drops them later
    summary = check_pair(dataset, "en-sw", raw_dir, CleanConfig(max_invalid_share=0.05))
    assert summary["splits"]["train"] == 98


def test_carving_more_pairs_than_distinct_training_pairs_stops(tmp_path: Path) -> None:
    _write_tsv(tmp_path / "c.tsv", _pairs(5) * 4)  # 20 lines, 5 distinct pairs
    dataset, raw_dir = _linked(tmp_path, {"pair": "en-sw", "train": "c.tsv", "valid": 3, "test": 2})
    with pytest.raises(DataError, match=r"carving 5 pairs for valid, test needs more than the 5"):
        check_pair(dataset, "en-sw", raw_dir, CleanConfig())


def test_test_pairs_in_training_warn_or_stop_as_configured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_tsv(tmp_path / "train.tsv", _pairs(50))
    # two of the test pairs are training pairs up to case and spacing
    _write_tsv(tmp_path / "test.tsv", [("SOURCE sentence  3", "target Sentence 3"),
                                       ("source sentence 7", "target sentence 7"),
                                       *_pairs(3, offset=100)])  # fmt: skip
    raw = {"pair": "en-sw", "train": "train.tsv", "valid": 5, "test": "test.tsv"}
    dataset, raw_dir = _linked(tmp_path, raw)
    with caplog.at_level(logging.WARNING):
        summary = check_pair(dataset, "en-sw", raw_dir, CleanConfig())
    assert summary["test_overlap"] == {"test": 2}
    assert "2 pair(s) of test set 'test' also occur in the training data" in caplog.text
    dataset, raw_dir = _linked(tmp_path, {**raw, "test_overlap": "error"})
    with pytest.raises(DataError, match=r"2 pair\(s\) of test set 'test' .*test_overlap: warn"):
        check_pair(dataset, "en-sw", raw_dir, CleanConfig())
    with pytest.raises(DataError, match=r"2 pair\(s\) of test set 'test'"):  # prepare too
        prepare_pair(dataset, "en-sw", raw_dir, tmp_path / "out", CleanConfig())
    assert not (tmp_path / "out" / "train.en").exists()  # no partial output


def _config(dataset_block: dict[str, Any], pair: str = "en-sw") -> dict[str, Any]:
    """A complete pipeline config around one local dataset ``own`` (a tiny model)."""
    test = REPO_ROOT / ".test" / "config" / "config.yaml"
    smoke = yaml.safe_load(test.read_text(encoding="utf-8"))["experiments"]["smoke_a"]
    experiment = {**smoke, "dataset": "own", "pair": pair, "test_sets": ["test"]}
    return {
        "datasets": {"own": dataset_block},
        "data": {"own": {pair: {"vocab_size": 600, "spm_sample_sentences": 100000,
                                "spm_seed": 1, "clean": {}}}},
        "experiments": {"own_tiny": experiment},
        "register": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a\tb\nc\n", r"c\.tsv: line 2: expected source<TAB>target"),
        ("a\tb\n" * 3, r"carving 2 pairs for valid, test needs more than the 1 distinct"),
    ],
)
def test_check_config_reads_the_data_before_any_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    (tmp_path / "c.tsv").write_text(content, encoding="utf-8")
    config = tmp_path / "own.yaml"
    block = {"pair": "en-sw", "train": str(tmp_path / "c.tsv"), "valid": 1, "test": 1}
    config.write_text(yaml.safe_dump(_config(block)), encoding="utf-8")
    assert main(["check-config", str(config)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {config}: datasets.own: ")
    assert re.search(message, line), line
    (tmp_path / "c.tsv").unlink()  # a missing file: named with its key, before any data check
    assert main(["check-config", str(config)]) == 2
    assert "config: datasets.own.train[0]: " in capsys.readouterr().err


def test_relative_paths_are_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data").mkdir()
    _write_tsv(tmp_path / "data" / "c.tsv", _pairs(30))
    config = tmp_path / "own.yaml"
    block = {"pair": "en-sw", "train": "data/c.tsv", "valid": 3, "test": 3}
    config.write_text(yaml.safe_dump(_config(block)), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "own en-sw: pairs read: train 30; carved from train: valid 3, test 3" in out


# --- carving ----------------------------------------------------------------------------------


def test_carved_splits_are_seeded_sized_and_share_no_pair_with_training(tmp_path: Path) -> None:
    pairs = _pairs(300)
    # variants equal after normalisation: whichever is drawn, none may stay in train
    pairs += [(s.upper(), f"  {t}  ") for s, t in _pairs(40)]
    _write_tsv(tmp_path / "c.tsv", pairs)
    raw = {"pair": "en-sw", "train": "c.tsv", "valid": 30, "test": {"t1": 20, "t2": 10}}

    def carve(seed: int) -> dict[str, list[tuple[str, str]]]:
        dataset, raw_dir = _linked(tmp_path, {**raw, "seed": seed})
        out = tmp_path / f"out{seed}"
        report = prepare_pair(dataset, "en-sw", raw_dir, out, CleanConfig(strip=False))
        splits = {}
        for split in ("train", "valid", "t1", "t2"):
            src = (out / f"{split}.en").read_text().splitlines()
            tgt = (out / f"{split}.sw").read_text().splitlines()
            splits[split] = list(zip(src, tgt, strict=True))
            if split != "train":
                assert report["splits"][split]["train_overlap"]["pair"] == 0
        assert report["splits"]["train"]["kept"] == len(splits["train"])
        return splits

    first = carve(1)
    assert {k: len(v) for k, v in first.items() if k != "train"} == {
        "valid": 30,
        "t1": 20,
        "t2": 10,
    }
    keys = {k: {(overlap_key(s), overlap_key(t)) for s, t in v} for k, v in first.items()}
    drawn = keys["valid"] | keys["t1"] | keys["t2"]
    assert len(drawn) == 60  # distinct across the carved splits
    assert not drawn & keys["train"]
    # every line is kept, drawn, or a normalised twin of a drawn pair
    twins = sum(1 for s, t in pairs if (overlap_key(s), overlap_key(t)) in drawn)
    assert len(first["train"]) + twins == len(pairs)
    assert carve(1) == first
    assert carve(2)["valid"] != first["valid"]


# --- any target language ----------------------------------------------------------------------


def test_bleu_tokenization_follows_the_target_language() -> None:
    assert bleu_tokenizer("de") == "13a" and bleu_tokenizer("sw") == "13a"
    assert bleu_tokenizer("zh") == "zh" and bleu_tokenizer("th") == "char"
    assert bleu_tokenizer("ja") == ("ja-mecab" if tokenizer_available("ja-mecab") else "char")
    assert bleu_tokenizer("ko") == ("ko-mecab" if tokenizer_available("ko-mecab") else "char")


def test_tokenized_bleu_is_undefined_where_words_are_not_space_separated(tmp_path: Path) -> None:
    hyps, refs = ["一二三四", "五六七"], ["一二三五", "五六七"]
    zh = score_lines(hyps, refs, "zh", resamples=0)
    assert "tok:zh" in zh.bleu["signature"]
    assert zh.bleu["score"] > 0  # characters, not one "word" per sentence
    assert zh.bleu_paper["score"] is None and zh.bleu_lc_tok["score"] is None
    assert "not defined for 'zh'" in zh.bleu_lc_tok["method"]
    (tmp_path / "e").mkdir()
    path = tmp_path / "e" / "test.scores.json"
    path.write_text(json.dumps({"sentences": 2, **zh.to_dict()}), encoding="utf-8")
    (row,) = table_cells([load_row(path, {"e": {"dataset": "own", "pair": "en-zh"}})])
    tok_bleu, lc_tok_bleu = row[7], row[9]
    assert (tok_bleu, lc_tok_bleu) == ("—", "—")
    de = score_lines(hyps, refs, "de", resamples=0)
    assert de.bleu_lc_tok["score"] is not None


def test_sentencepiece_coverage_defaults_by_script(tmp_path: Path) -> None:
    assert character_coverage(["en", "zh"]) == 0.9995
    assert character_coverage(["en", "de"]) == 0.9999
    for lang in ("en", "zh"):
        (tmp_path / f"train.{lang}").write_text(
            "".join(f"{_to_script('ein hund läuft') if lang == 'zh' else 'a dog runs'} {i}\n"
                    for i in range(200)), encoding="utf-8",
        )  # fmt: skip
    prefix = tmp_path / "spm"
    args = ["spm-train", "--inputs", str(tmp_path / "train.en"), str(tmp_path / "train.zh"),
            "--vocab-size", "320", "--model-prefix", str(prefix)]  # fmt: skip
    assert main(args) == 0
    assert json.loads(prefix.with_suffix(".json").read_text())["character_coverage"] == 0.9995


# --- the whole DAG ----------------------------------------------------------------------------


def _snakemake(workdir: Path, config: dict[str, Any]) -> subprocess.CompletedProcess:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    snakemake = snakemake_command()
    cmd = [*snakemake, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--configfile", str(path)]  # fmt: skip
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
           "PYTHONPATH": checkout_pythonpath()}  # fmt: skip
    # run from the working directory: the config's relative paths are relative to it
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=workdir)


def _dataset_inputs(workdir: Path) -> list[tuple[str, str, str]]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    return sorted(
        (json.loads(d.dataset.source)["uri"], d.dataset.digest, tag.value)
        for run in runs for d in run.inputs.dataset_inputs for tag in d.tags
        if tag.key == "mlflow.data.context"
    )  # fmt: skip


@pytest.mark.slow
def test_the_whole_dag_on_a_tsv_with_carved_splits(tmp_path: Path, shared_mirror: Path) -> None:
    pairs = list(zip(_multi30k(shared_mirror, "train", "en", 1500),
                     _multi30k(shared_mirror, "train", "de", 1500), strict=True))  # fmt: skip
    (tmp_path / "data").mkdir()
    _write_tsv(tmp_path / "data" / "corpus.tsv", pairs)
    block = {"pair": "en-de", "train": "data/corpus.tsv", "valid": 100, "test": 100}
    result = _snakemake(tmp_path, _config(block, "en-de"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    scores = json.loads((tmp_path / "results/runs/own_tiny/test.scores.json").read_text())
    assert scores["sentences"] == 100 and "tok:13a" in scores["bleu"]["signature"]
    assert scores["bleu_lc_tok"]["score"] is not None and "ci95" in scores["bleu"]
    report = (tmp_path / "results" / "report.md").read_text()
    assert "| own_tiny | own en-de | tiny | test | 100 |" in report
    clean = json.loads((tmp_path / "results/data/own/en-de/clean_report.json").read_text())
    assert clean["splits"]["test"]["train_overlap"]["pair"] == 0
    import hashlib

    digest = hashlib.sha256((tmp_path / "data" / "corpus.tsv").read_bytes()).hexdigest()
    uri = (tmp_path / "data" / "corpus.tsv").as_uri()
    contexts = {(u, context) for u, d, context in _dataset_inputs(tmp_path) if digest.startswith(d)}
    # the carved dev and test sets come from the training file
    assert contexts == {(uri, "training"), (uri, "validation"), (uri, "test")}


@pytest.mark.slow
def test_the_whole_dag_on_file_pairs_in_a_non_latin_script(
    tmp_path: Path, shared_mirror: Path
) -> None:
    data = tmp_path / "corpus"
    data.mkdir()
    for split, n in (("train", 1500), ("val", 60), ("test_2016_flickr", 60)):
        src = _multi30k(shared_mirror, split, "en", n)
        tgt = [_to_script(line) for line in _multi30k(shared_mirror, split, "de", n)]
        (data / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        with gzip.open(data / f"{split}.zh.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(tgt) + "\n")
    block = {"pair": "en-zh", "train": str(data / "train"), "valid": str(data / "val"),
             "test": str(data / "test_2016_flickr")}  # fmt: skip
    result = _snakemake(tmp_path, _config(block, "en-zh"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    spm = json.loads((tmp_path / "results/spm/own/en-zh/spm.json").read_text())
    assert spm["character_coverage"] == 0.9995
    scores = json.loads((tmp_path / "results/runs/own_tiny/test.scores.json").read_text())
    assert "tok:zh" in scores["bleu"]["signature"] and scores["sentences"] == 60
    assert scores["bleu_paper"]["score"] is None and scores["bleu_lc_tok"]["score"] is None
    row = next(ln for ln in (tmp_path / "results/report.md").read_text().splitlines()
               if ln.startswith("| own_tiny |"))  # fmt: skip
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[7] == "—" and cells[9] == "—" and cells[5] != "—"
    sources = {u for u, _, _ in _dataset_inputs(tmp_path)}
    files = [data / f"{s}.en" for s in ("train", "val", "test_2016_flickr")]
    files += [data / f"{s}.zh.gz" for s in ("train", "val", "test_2016_flickr")]
    assert sources == {path.as_uri() for path in files}


# --- the starter config -----------------------------------------------------------------------

EXAMPLE = REPO_ROOT / "config" / "experiments" / "own_data_example.yaml"


def _starter(tmp_path: Path, shared_mirror: Path, n: int = 2500, tgt: str = "de") -> Path:
    """The starter config in a working directory holding the file it names (Multi30k pairs,
    English and ``tgt``)."""
    (tmp_path / "data").mkdir()
    pairs = zip(_multi30k(shared_mirror, "train", "en", n),
                _multi30k(shared_mirror, "train", tgt, n), strict=True)  # fmt: skip
    _write_tsv(tmp_path / "data" / "my_corpus.tsv", list(pairs))
    config = tmp_path / "own_data_example.yaml"
    config.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    return config


def test_the_starter_config_names_its_pair_once_and_checks_plans_and_dry_runs(
    tmp_path: Path, shared_mirror: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The pair is written once, in the dataset's block: changed there (English-French), it is
    the pair every stage of the dry run reads, writes and scores."""
    text = EXAMPLE.read_text(encoding="utf-8")
    block = yaml.safe_load(text)["datasets"]["my_corpus"]
    lines = [ln for ln in text.split("datasets:\n", 1)[1].split("\n\n")[0]
             .splitlines() if not ln.strip().startswith("#")]  # fmt: skip
    assert len(lines) <= 10 and set(block) == {"pair", "train", "valid", "test"}
    assert text.count("en-de") == 1 and "pair: en-de" in text
    config = _starter(tmp_path, shared_mirror, tgt="fr")
    config.write_text(text.replace("pair: en-de", "pair: en-fr"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert (
        "my_corpus en-fr: pairs read: train 2500; carved from train: valid 1000, test 1000" in out
    )
    assert main(["plan", "--configfile", str(config), "--estimate-only"]) == 0
    assert "my_corpus_tiny" in capsys.readouterr().out
    snakemake = snakemake_command()
    result = subprocess.run(
        [*snakemake, "-n", "-p", "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
         "--configfile", str(config)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rule in ("download_my_corpus", "prepare_my_corpus_en_fr", "spm_train", "train", "score"):
        assert re.search(rf"^{rule}\s+\d+$", result.stdout, re.M), result.stdout[-3000:]
    commands = result.stdout
    assert "en-de" not in commands and "--tgt de" not in commands
    for stage_reads_the_pair in (
        "results/data/my_corpus/en-fr/test.en", "results/spm/my_corpus/en-fr/spm.model",
        "results/bin/my_corpus/en-fr", "--src en --tgt fr", "--tgt-lang fr",
    ):  # fmt: skip
        assert stage_reads_the_pair in commands, stage_reads_the_pair


@pytest.mark.parametrize(("amx", "avx512_bf16"), [(True, True), (False, True), (False, False)])
def test_the_starter_is_sized_as_the_demo_on_a_cpu_with_and_without_bf16(
    tmp_path: Path, shared_mirror: Path, monkeypatch: pytest.MonkeyPatch,
    amx: bool, avx512_bf16: bool,
) -> None:  # fmt: skip
    """On a CPU with bf16 instructions the starter trains in bf16-mixed for the demo's bf16
    steps, elsewhere in fp32 for its fp32 steps: the demo's schedule, sized as the demo's."""
    import torch

    from transformer_nmt.experiments import load_pipeline
    from transformer_nmt.training.config import TrainConfig
    from transformer_nmt.training.resolution import resolve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # accelerator: auto
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    config = _starter(tmp_path, shared_mirror, n=300)
    monkeypatch.chdir(tmp_path)
    sized = {}
    for path, name in ((REPO_ROOT / "config" / "config.yaml", "multi30k_en_de_tiny"),
                       (config, "my_corpus_tiny")):  # fmt: skip
        train = TrainConfig.from_dict(load_pipeline(path).train_config(name)["train"])
        resolved = resolve(train)
        run = train.for_precision(resolved.precision).to_dict()
        run.pop("accelerator")  # the starter's is auto: a GPU where there is one
        sized[name] = (resolved.accelerator, resolved.precision, resolved.pad_multiple, run)
    demo, starter = sized["multi30k_en_de_tiny"], sized["my_corpus_tiny"]
    assert starter == demo
    expected = ("bf16-mixed", 8, 1800) if avx512_bf16 else ("32-true", 1, 1600)
    assert (starter[1], starter[2], starter[3]["max_steps"]) == expected


def test_every_study_key_works_on_a_local_dataset(tmp_path: Path, shared_mirror: Path) -> None:
    """Seeds, Table 3 and significance expand over a local dataset as over the registry's."""
    from transformer_nmt.experiments import Pipeline

    config = yaml.safe_load(_starter(tmp_path, shared_mirror, n=300).read_text())
    config["datasets"]["my_corpus"].update(train=str(tmp_path / "data" / "my_corpus.tsv"),
                                           valid=20, test=20)  # fmt: skip
    exp = config["experiments"]["my_corpus_tiny"]
    exp["train"].update(val_beam_bleu_every_steps=1600)
    exp["seeds"] = [1, 2]
    config["table3"] = {"base": "my_corpus_tiny", "rows": ["C1"]}
    config["significance"] = {"baseline": "my_corpus_tiny"}
    pipeline = Pipeline(config)
    assert pipeline.experiments() == [
        "my_corpus_tiny.C1.seed1", "my_corpus_tiny.C1.seed2",
        "my_corpus_tiny.seed1", "my_corpus_tiny.seed2",
    ]  # fmt: skip
    assert pipeline.experiment("my_corpus_tiny.C1.seed2")["model_overrides"]["N"] == 2
    assert pipeline.report_studies()["significance"]["runs"]["my_corpus_tiny.C1"] == [
        "my_corpus_tiny.C1.seed1", "my_corpus_tiny.C1.seed2",
    ]  # fmt: skip
    assert pipeline.splits("my_corpus", "en-de") == ["train", "valid", "test"]
