"""prepare: WMT-shaped archives (tgz with SGML and parallel text), cleaning report, bad inputs.

Every fixture is built here in tmp dirs: a tgz of Europarl-like text, a plain tar holding
gzipped Gigaword-like files, a dev tgz and a test-full tgz of WMT SGML.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import tarfile
from pathlib import Path

import pytest
import yaml

from transformer_nmt.cli import main
from transformer_nmt.data import prepare, splits
from transformer_nmt.data.clean import CleanConfig
from transformer_nmt.data.prepare import prepare_pair
from transformer_nmt.data.readers import InvalidLine, decode_block
from transformer_nmt.data.registry import Side, get_dataset
from transformer_nmt.errors import ConfigError, DataError


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            _add(tar, name, data)


def _lines(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _sgml(lang: str, segments: list[str]) -> bytes:
    body = [f'<srcset setid="newstest2014" srclang="any" trglang="{lang}">']
    body.append('<doc sysid="ref" docid="doc1" genre="news" origlang="en">')
    body += [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segments, 1)]
    body += ["</doc>", "</srcset>"]
    return _lines(*body)


def _side(file: str, member: str | None, fmt: str) -> dict:
    return {"file": file, "member": member, "format": fmt}


def _write_registry(raw: Path, splits: dict, tests: list[str]) -> Path:
    files = {
        p.name: {"url": f"https://example.invalid/{p.name}", "sha256": _sha(p)}
        for p in sorted(raw.iterdir())
    }
    reg = {"wmt_toy": {"files": files, "pairs": {"en-de": {"splits": splits}}}}
    reg["wmt_toy"]["test_splits"] = tests
    path = raw.parent / "datasets.yaml"
    path.write_text(yaml.safe_dump(reg, sort_keys=False))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


EUROPARL_EN = [
    "Resumption of the session",
    "  I declare resumed the session.  ",  # stripped
    "",  # empty source: dropped
    "Please rise for a minute of silence.",
    "one two three four five six seven eight nine ten eleven twelve",  # ratio 12:1
    "word " * 30,  # 30 tokens: too long for max_length 20
    "Resumption of the session",  # duplicate of line 1
    "Bell\x07 rings",  # a control character: dropped
]
EUROPARL_DE = [
    "Wiederaufnahme der Sitzungsperiode",
    "Ich erkläre die Sitzung für wiederaufgenommen.",
    "Leere Quelle",
    "Bitte erheben Sie sich zu einer Schweigeminute.",
    "eins",
    "Wort " * 30,
    "Wiederaufnahme der Sitzungsperiode",
    "Glocke läutet",
]
GIGA_EN = ["Resumption of the session", "A new pair from the second corpus", "Trailing tab\t"]
GIGA_DE = ["Wiederaufnahme der Sitzungsperiode", "Ein neues Paar", "Tabulator"]
DEV_EN = ["Dev one", "", "Dev one"]  # never filtered: empty line and duplicate stay
DEV_DE = ["Dev eins", "", "Dev eins"]
TEST_EN = ["Gutach:  Increased safety for pedestrians ", "Cats &amp; dogs"]
TEST_DE = ["Gutach: Noch mehr Sicherheit für Fußgänger", "Katzen &amp; Hunde"]


@pytest.fixture
def wmt_toy(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _tar(
        raw / "training-parallel-europarl-v7.tgz",
        {
            "training/europarl-v7.de-en.en": _lines(*EUROPARL_EN),
            "training/europarl-v7.de-en.de": _lines(*EUROPARL_DE),
        },
    )
    _tar(
        raw / "training-giga.tar",
        {
            "giga.en.gz": gzip.compress(_lines(*GIGA_EN)),
            "giga.de.gz": gzip.compress(_lines(*GIGA_DE)),
        },
        mode="w",
    )
    _tar(
        raw / "dev.tgz",
        {"dev/newstest2013.en": _lines(*DEV_EN), "dev/newstest2013.de": _lines(*DEV_DE)},
    )
    _tar(
        raw / "test-full.tgz",
        {
            "test-full/newstest2014-deen-src.en.sgm": _sgml("en", TEST_EN),
            "test-full/newstest2014-deen-ref.de.sgm": _sgml("de", TEST_DE),
        },
    )
    euro = "training-parallel-europarl-v7.tgz"
    splits = {
        "train": [
            {
                "name": "europarl_v7",
                "en": _side(euro, "training/europarl-v7.de-en.en", "text"),
                "de": _side(euro, "training/europarl-v7.de-en.de", "text"),
            },
            {
                "name": "giga",
                "en": _side("training-giga.tar", "giga.en.gz", "gzip"),
                "de": _side("training-giga.tar", "giga.de.gz", "gzip"),
            },
        ],
        "valid": [
            {
                "name": "newstest2013",
                "en": _side("dev.tgz", "dev/newstest2013.en", "text"),
                "de": _side("dev.tgz", "dev/newstest2013.de", "text"),
            }
        ],
        "newstest2014": [
            {
                "name": "newstest2014",
                "en": _side("test-full.tgz", "test-full/newstest2014-deen-src.en.sgm", "sgml"),
                "de": _side("test-full.tgz", "test-full/newstest2014-deen-ref.de.sgm", "sgml"),
            }
        ],
    }
    return get_dataset(_write_registry(raw, splits, ["newstest2014"]), "wmt_toy"), raw


def _read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


# one broken pair of 8 in europarl: above the default 1% a damaged file would stop the stage
RULES = CleanConfig(max_length=20, max_length_ratio=3.0, max_invalid_share=0.2)


def test_wmt_archives_extract_clean_and_report(wmt_toy, tmp_path):
    dataset, raw = wmt_toy
    out = tmp_path / "data"
    report = prepare_pair(dataset, "en-de", raw, out, RULES)
    assert _read(out / "train.en") == [
        "Resumption of the session",
        "I declare resumed the session.",
        "Please rise for a minute of silence.",
        "A new pair from the second corpus",
        "Trailing tab",
    ]
    assert _read(out / "train.de")[3:] == ["Ein neues Paar", "Tabulator"]
    train = report["splits"]["train"]
    assert train["filtered"] is True
    assert train["corpora"]["europarl_v7"] == {
        "read": 8,
        "kept": 3,
        "dropped": {
            "invalid_utf8": 0,
            "control_chars": 1,
            "empty": 1,
            "too_long": 1,
            "length_ratio": 1,
            "duplicate": 1,
        },
        "modified": {"tabs": 0},
    }
    # the first giga pair repeats europarl's first pair: a duplicate across corpora
    assert train["corpora"]["giga"]["dropped"]["duplicate"] == 1
    assert train["corpora"]["giga"]["modified"] == {"tabs": 1}  # a tab becomes a space
    assert (train["read"], train["kept"]) == (11, 5)
    assert json.loads((out / "clean_report.json").read_text()) == report
    # validation and test: never filtered, SGML segments read as sacrebleu reads them
    assert _read(out / "valid.en") == DEV_EN and _read(out / "valid.de") == DEV_DE
    assert _read(out / "newstest2014.en") == [
        "Gutach: Increased safety for pedestrians",
        "Cats &amp; dogs",
    ]
    assert _read(out / "newstest2014.de") == TEST_DE
    assert report["splits"]["valid"]["filtered"] is False
    assert report["splits"]["valid"]["kept"] == 3
    assert sorted(p.name for p in out.iterdir()) == [
        "clean_report.json",
        "newstest2014.de",
        "newstest2014.en",
        "train.de",
        "train.en",
        "valid.de",
        "valid.en",
    ]


def test_rules_can_be_switched_off_and_max_sentences_cuts_every_split(wmt_toy, tmp_path):
    dataset, raw = wmt_toy
    rules = CleanConfig(
        dedupe=False, max_length=None, max_length_ratio=None, drop_control_chars=False
    )
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "a", rules)
    assert report["splits"]["train"]["kept"] == 10  # only the empty pair dropped
    assert report["splits"]["train"]["dropped"]["empty"] == 1
    assert _read(tmp_path / "a" / "train.en")[6] == "Bell\x07 rings"  # kept as it was
    small = CleanConfig(max_sentences=2)
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "b", small)
    assert {split: r["read"] for split, r in report["splits"].items()} == {
        "train": 2,
        "valid": 2,
        "newstest2014": 2,
    }
    assert len(_read(tmp_path / "b" / "valid.de")) == 2


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.iterdir())}


@pytest.mark.parametrize("chunk", [1, 3, prepare.CHUNK_PAIRS])
def test_outputs_do_not_depend_on_workers_or_chunks(wmt_toy, tmp_path, monkeypatch, chunk):
    # the parent cuts the corpora into chunks: a pair, a few, one chunk per corpus
    monkeypatch.setattr(prepare, "CHUNK_PAIRS", chunk)
    monkeypatch.setattr(splits, "OVERLAP_CHUNK_LINES", chunk)
    dataset, raw = wmt_toy
    no_dedupe = CleanConfig(dedupe=False, max_invalid_share=0.2)
    for name, rules in (("rules", RULES), ("budget", CleanConfig(max_sentences=5)),
                        ("no_dedupe", no_dedupe)):  # fmt: skip
        reports = [
            prepare_pair(dataset, "en-de", raw, tmp_path / f"{name}{w}", rules, workers=w)
            for w in (1, 2)
        ]
        assert reports[0] == reports[1]
        assert _outputs(tmp_path / f"{name}1") == _outputs(tmp_path / f"{name}2")
    assert _read(tmp_path / "rules2" / "train.en") == [
        "Resumption of the session",
        "I declare resumed the session.",
        "Please rise for a minute of silence.",
        "A new pair from the second corpus",
        "Trailing tab",
    ]
    assert reports[1]["splits"]["train"]["corpora"]["giga"]["modified"] == {"tabs": 1}
    budget = json.loads((tmp_path / "budget2" / "clean_report.json").read_text())
    assert budget["splits"]["train"]["corpora"]["europarl_v7"]["read"] == 5
    assert budget["splits"]["train"]["corpora"]["giga"]["read"] == 0  # never opened
    assert len(_read(tmp_path / "no_dedupe2" / "train.en")) == 8


def test_sgml_training_corpus_is_read_by_segments(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "CHUNK_PAIRS", 2)
    raw = tmp_path / "raw"
    raw.mkdir()
    segments_en = ["One pair", "Two  pairs ", "Three pairs", "Four"]
    segments_de = ["Ein Paar", "Zwei Paare", "Drei Paare", "Vier"]
    (raw / "t.en.sgm").write_bytes(_sgml("en", segments_en))
    (raw / "t.de.sgm").write_bytes(_sgml("de", segments_de))
    corpus = {"name": "t", "en": _side("t.en.sgm", None, "sgml"),
              "de": _side("t.de.sgm", None, "sgml")}  # fmt: skip
    dataset = get_dataset(_write_registry(raw, {"train": [corpus], "valid": [corpus]}, []),
                          "wmt_toy")  # fmt: skip
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "out", CleanConfig(), workers=2)
    assert _read(tmp_path / "out" / "train.en") == ["One pair", "Two pairs", "Three pairs", "Four"]
    assert _read(tmp_path / "out" / "train.de") == segments_de
    assert report["splits"]["train"]["read"] == 4


def test_an_error_in_a_worker_process_names_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "CHUNK_PAIRS", 2)  # line 5 is decoded in the third job
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.tsv").write_bytes(_lines("a\tA", "b\tB", "c\tC", "d\tD", "e E", "f\tF"))
    corpus = {"name": "t", "en": {**_side("train.tsv", None, "tsv"), "column": 0},
              "de": {**_side("train.tsv", None, "tsv"), "column": 1}}  # fmt: skip
    valid = {"name": "v", "en": _side("train.tsv", None, "text"),
             "de": _side("train.tsv", None, "text")}  # fmt: skip
    dataset = get_dataset(_write_registry(raw, {"train": [corpus], "valid": [valid]}, []),
                          "wmt_toy")  # fmt: skip
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"raw/train\.tsv: line 5: expected source<TAB>target"):
        prepare_pair(dataset, "en-de", raw, out, CleanConfig(), workers=2)
    assert list(out.iterdir()) == []


def test_decode_block_keeps_lines_numbers_and_bad_bytes():
    text = Side("f", None, "text", None)
    assert decode_block(b"", 1, text, "f", False) == []
    assert decode_block(b"a\r\n\nb", 1, text, "f", False) == ["a", "", "b"]
    lenient = decode_block(b"ok\ncaf\xe9\nfine\n", 10, text, "f", True)
    assert lenient == ["ok", "caf\ufffd", "fine"]
    assert isinstance(lenient[1], InvalidLine) and lenient[1].number == 11
    assert not isinstance(lenient[0], InvalidLine)
    with pytest.raises(DataError, match=r"^f: line 11: invalid UTF-8 \(byte 4: b'\\xe9'\)$"):
        decode_block(b"ok\ncaf\xe9\n", 10, text, "f", False)
    tsv = Side("f", None, "tsv", 1)
    assert decode_block(b"a\tb\nc\td\n", 1, tsv, "f", False) == ["b", "d"]
    with pytest.raises(DataError, match=r"^f: line 2: expected source<TAB>target"):
        decode_block(b"a\tb\nc d\n", 1, tsv, "f", False)


def test_invalid_lines_reach_worker_processes_with_their_number():
    line = pickle.loads(pickle.dumps(InvalidLine("caf\ufffd", 7)))
    assert isinstance(line, InvalidLine) and (line, line.number) == ("caf\ufffd", 7)


def test_cli_prepare_with_clean_json(wmt_toy, tmp_path, capsys):
    dataset, raw = wmt_toy
    reg = raw.parent / "datasets.yaml"
    base = ["prepare", "--registry", str(reg), "--dataset", "wmt_toy", "--pair", "en-de"]
    base += ["--raw-dir", str(raw), "--out-dir", str(tmp_path / "out")]
    clean = '{"max_length": 20, "max_length_ratio": 3, "max_invalid_share": 0.2}'
    assert main([*base, "--clean", clean]) == 0
    assert len(_read(tmp_path / "out" / "train.en")) == 5
    assert main([*base, "--clean", '{"max_len": 20}']) == 2
    assert "unknown cleaning rule 'max_len'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_len": 5}, "unknown cleaning rule 'max_len'"),
        ({"dedupe": "yes"}, "dedupe must be true or false"),
        ({"max_length": 0}, "max_length must be null or a positive integer"),
        ({"max_length_ratio": 0.5}, "max_length_ratio must be null or a number >= 1"),
        ({"max_sentences": 1.5}, "max_sentences must be null or a positive integer"),
        ({"max_invalid_share": 2}, "max_invalid_share must be null or a number from 0 to 1"),
    ],
)
def test_clean_config_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        CleanConfig.from_dict(raw)


# --- bad inputs: each is a DataError naming the file (and line), and leaves no output ---------


def _plain_dataset(tmp_path: Path, train_en: bytes, train_de: bytes, fmt: str = "text"):
    raw = tmp_path / "raw"
    raw.mkdir()
    suffix = ".gz" if fmt == "gzip" else ""
    (raw / f"train.en{suffix}").write_bytes(train_en)
    (raw / f"train.de{suffix}").write_bytes(train_de)
    corpus = {
        "name": "c",
        "en": _side(f"train.en{suffix}", None, fmt),
        "de": _side(f"train.de{suffix}", None, fmt),
    }
    reg = _write_registry(raw, {"train": [corpus], "valid": [corpus]}, [])
    return get_dataset(reg, "wmt_toy"), raw


def _fails(dataset, raw, out: Path, message: str) -> None:
    with pytest.raises(DataError, match=message):
        prepare_pair(dataset, "en-de", raw, out, CleanConfig())
    assert not out.exists() or list(out.iterdir()) == []


def test_truncated_gzip_names_file_and_line(tmp_path):
    full = gzip.compress(_lines(*[f"sentence number {i}" for i in range(5000)]))
    good = gzip.compress(_lines(*[f"Satz Nummer {i}" for i in range(5000)]))
    dataset, raw = _plain_dataset(tmp_path, full[: len(full) // 2], good, fmt="gzip")
    _fails(
        dataset, raw, tmp_path / "out", r"raw/train\.en\.gz: truncated gzip stream after line \d+"
    )


def _train_valid_dataset(tmp_path: Path, train_en: bytes, train_de: bytes, valid_en: bytes):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, data in (("train.en", train_en), ("train.de", train_de), ("valid.en", valid_en),
                       ("valid.de", b"a\nb\nc\n")):  # fmt: skip
        (raw / name).write_bytes(data)
    splits = {
        split: [
            {
                "name": split,
                "en": _side(f"{split}.en", None, "text"),
                "de": _side(f"{split}.de", None, "text"),
            }
        ]  # fmt: skip
        for split in ("train", "valid")
    }
    return get_dataset(_write_registry(raw, splits, []), "wmt_toy"), raw


def _numbered(n: int, word: str, bad: dict[int, bytes]) -> bytes:
    return b"".join(bad.get(i, f"{word} {i}\n".encode()) for i in range(1, n + 1))


def test_training_pairs_that_are_not_text_are_dropped_and_counted(tmp_path):
    # 200 pairs: line 7 of en has a byte that is no UTF-8, line 50 of de a control character
    train_en = _numbered(200, "sentence", {7: b"caf\xe9 cr\xe8me\n"})
    train_de = _numbered(200, "Satz", {50: b"Satz \x1b[0m 50\n"})
    dataset, raw = _train_valid_dataset(tmp_path, train_en, train_de, b"x\ny\nz\n")
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "out", CleanConfig())
    train = report["splits"]["train"]["corpora"]["train"]
    assert (train["read"], train["kept"]) == (200, 198)
    assert train["dropped"]["invalid_utf8"] == 1 and train["dropped"]["control_chars"] == 1
    kept_en = _read(tmp_path / "out" / "train.en")
    assert "sentence 6" in kept_en and "sentence 50" not in kept_en
    assert not any(line.startswith("caf") for line in kept_en)
    assert len(kept_en) == len(_read(tmp_path / "out" / "train.de")) == 198


@pytest.mark.parametrize("chunk", [2, prepare.CHUNK_PAIRS])
def test_too_many_broken_training_pairs_stop_the_stage_naming_the_file(
    tmp_path, monkeypatch, chunk
):
    monkeypatch.setattr(prepare, "CHUNK_PAIRS", chunk)  # line 3: the second chunk's first
    bad = {3: b"\xff\xfe\n", 90: b"\xc3\n", 91: b"ok \x00\n"}  # 3 of 200: 1.5% > 1%
    train_en = _numbered(200, "sentence", bad)
    dataset, raw = _train_valid_dataset(tmp_path, train_en, _numbered(200, "Satz", {}), b"x\n" * 3)
    _fails(
        dataset,
        raw,
        tmp_path / "out",
        r"raw/train\.en: 3 of the 200 pairs of corpus 'train' \(1\.50%\) are not valid UTF-8 or "
        r"hold control characters \(the first at line 3\), more than clean\.max_invalid_share "
        r"\(1\.00%\) allows: the file is likely damaged \(or raise clean\.max_invalid_share\); "
        r"fetch the files again with `snakemake --forcerun download_wmt_toy \.\.\.`",
    )
    loose = CleanConfig(max_invalid_share=0.02)
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "out", loose)
    assert report["splits"]["train"]["dropped"]["invalid_utf8"] == 2


def test_dev_and_test_sets_stay_strict_utf8_and_name_the_fix(tmp_path):
    train = _numbered(10, "s", {})
    dataset, raw = _train_valid_dataset(tmp_path, train, train, b"ok\nfine\nbad \xff byte\n")
    _fails(
        dataset,
        raw,
        tmp_path / "out",
        r"raw/valid\.en: line 3: invalid UTF-8 \(byte 5: b'\\xff'\); fetch the files again with "
        r"`snakemake --forcerun download_wmt_toy \.\.\.`",
    )


def test_an_empty_corpus_file_names_the_file_and_the_fix(tmp_path):
    dataset, raw = _train_valid_dataset(tmp_path, b"", b"", b"x\ny\nz\n")
    _fails(
        dataset,
        raw,
        tmp_path / "out",
        r"raw/train\.en: corpus 'train' has no line; .*--forcerun download_wmt_toy",
    )


@pytest.mark.parametrize("chunk", [1, 2, 3, prepare.CHUNK_PAIRS])
def test_misaligned_line_counts_name_both_files(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(prepare, "CHUNK_PAIRS", chunk)  # counted across chunks, exactly
    dataset, raw = _plain_dataset(tmp_path, b"a\nb\nc\nd\ne\n", b"x\ny\n")
    _fails(
        dataset,
        raw,
        tmp_path / "out",
        r"misaligned corpus 'c': .*raw/train\.de has 2 lines "
        r"but .*raw/train\.en has 5; every line .*; fetch the files again with "
        r"`snakemake --forcerun download_wmt_toy \.\.\.`",
    )


def test_checksum_mismatch_of_raw_file(tmp_path):
    dataset, raw = _plain_dataset(tmp_path, b"a\n", b"x\n")
    (raw / "train.en").write_bytes(b"changed\n")
    _fails(dataset, raw, tmp_path / "out", r"raw/train\.en: sha256 does not match")


def _archive_dataset(tmp_path: Path, build) -> tuple:
    raw = tmp_path / "raw"
    raw.mkdir()
    with tarfile.open(raw / "corpus.tgz", "w:gz") as tar:
        _add(tar, "c/train.en", b"hello\n")
        _add(tar, "c/train.de", b"hallo\n")
        build(tar)
    corpus = {
        "name": "c",
        "en": _side("corpus.tgz", "c/train.en", "text"),
        "de": _side("corpus.tgz", "c/train.de", "text"),
    }
    reg = _write_registry(raw, {"train": [corpus], "valid": [corpus]}, [])
    return get_dataset(reg, "wmt_toy"), raw


def _link(tar: tarfile.TarFile, name: str, target: str, kind=tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda tar: _add(tar, "../escape.txt", b"x"), r"unsafe archive member '\.\./escape\.txt'"),
        (lambda tar: _add(tar, "/etc/evil", b"x"), r"unsafe archive member '/etc/evil'"),
        (lambda tar: _link(tar, "c/link", "../../outside"), r"unsafe archive member 'c/link'"),
        (lambda tar: _link(tar, "c/abs", "/etc/passwd"), r"unsafe archive member 'c/abs'"),
    ],
    ids=["dotdot", "absolute", "symlink-out", "symlink-absolute"],
)
def test_unsafe_archives_are_refused(tmp_path, build, message):
    dataset, raw = _archive_dataset(tmp_path, build)
    _fails(dataset, raw, tmp_path / "out", rf"raw/corpus\.tgz: {message}")


def test_safe_archive_reads_and_missing_member_is_named(tmp_path):
    dataset, raw = _archive_dataset(tmp_path, lambda tar: _link(tar, "c/ok", "train.en"))
    prepare_pair(dataset, "en-de", raw, tmp_path / "out", CleanConfig())
    assert _read(tmp_path / "out" / "train.en") == ["hello"]
    corpus = dataset.pairs["en-de"].splits["valid"][0]
    object.__setattr__(corpus.sides["de"], "member", "c/nope.de")
    _fails(dataset, raw, tmp_path / "out2", r"corpus\.tgz: has no member 'c/nope\.de'")


# --- data provenance: evaluation sentences that also occur in the training data -------------


def test_train_overlap_of_dev_and_test_sets_is_counted_and_listed(tmp_path, monkeypatch):
    import transformer_nmt.data.splits as split_rules

    raw = tmp_path / "raw"
    raw.mkdir()
    train_en = ["A dog runs.", "Two  men talk", "ｃａｔｓ sleep", "A bird sings", "Rain falls"]
    train_de = ["Ein Hund rennt.", "Zwei Männer reden", "Katzen schlafen", "Ein Vogel", "Regen"]
    # valid: 1 pair (case + spacing), 2 source only (one fullwidth: NFKC), 1 target only, 1 none
    valid_en = ["a DOG runs.", "two men talk", "cats sleep", "A fish swims", "Snow falls", ""]
    valid_de = ["ein hund  rennt.", "Zwei Frauen", "Katzen essen", "Ein Vogel", "Schnee", ""]
    test_en, test_de = ["Rain falls", "Nothing here"], ["Regen", "Nichts"]
    files = {"train.en": train_en, "train.de": train_de, "valid.en": valid_en,
             "valid.de": valid_de, "test.en": test_en, "test.de": test_de}  # fmt: skip
    for name, lines in files.items():
        (raw / name).write_bytes(_lines(*lines))

    def corpus(split):
        return {"name": split, "en": _side(f"{split}.en", None, "text"),
                "de": _side(f"{split}.de", None, "text")}  # fmt: skip

    splits = {"train": [corpus("train")], "valid": [corpus("valid")], "test": [corpus("test")]}
    dataset = get_dataset(_write_registry(raw, splits, ["test"]), "wmt_toy")
    monkeypatch.setattr(split_rules, "OVERLAP_LINES", 2)  # counts stay complete, lists are capped
    report = prepare_pair(dataset, "en-de", raw, tmp_path / "out", CleanConfig())
    assert report["overlap_normalisation"] == "NFKC, lowercase, whitespace collapsed"
    assert report["splits"]["valid"]["train_overlap"] == {
        "sentences": 6,
        "source": 3,
        "target": 2,
        "pair": 1,
        "lines": {"source": [1, 2], "target": [1, 4], "pair": [1]},
    }
    assert report["splits"]["test"]["train_overlap"] == {
        "sentences": 2, "source": 1, "target": 1, "pair": 1,
        "lines": {"source": [1], "target": [1], "pair": [1]},
    }  # fmt: skip
    assert "train_overlap" not in report["splits"]["train"]
    saved = json.loads((tmp_path / "out" / "clean_report.json").read_text(encoding="utf-8"))
    assert saved == report
    assert split_rules.overlap_key("  Ａ\u00a0Dog\tRUNS ") == "a dog runs"
