"""WMT14 EN-DE and EN-FR data stages end to end, offline: download -> prepare -> spm_train ->
encode, run by Snakemake's own rules (download_wmt14_en_de, prepare_wmt14_en_de_en_de, ...).

The archives are fixtures built here with the layouts that config/datasets.yaml names (the tgz
members and their paths, WMT SGML test sets with doc/seg structure, the Gigaword tar holding
gzipped members), with bytes that are not UTF-8 and control characters in Common Crawl, and are
served from 127.0.0.1. The registry under test is the shipped one with only its URLs pointed at
that server and the md5s of the fixtures in place of sacrebleu's.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.conftest import REPO_ROOT, local_http_server
from tests.test_workflow import _snakemake

DATASETS = ("wmt14_en_de", "wmt14_en_fr")
N = 250  # pairs per training corpus (2 broken ones in Common Crawl: 0.8%, under the 1% cap)
TRICKY = [  # SGML segments as WMT writes them: entities stay (sacrebleu does not unescape)
    "Gutach: Increased safety for pedestrians",
    "  They are not even 100 metres apart:   On Tuesday, the new B 33 pedestrian lights  ",
    "&quot;Quotes&quot; &amp; ampersands &lt;stay&gt; as they are",
    "Ünïcödé – dashes — and “quotes”",
]


def _registry_entries() -> dict[str, Any]:
    raw = yaml.safe_load((REPO_ROOT / "config" / "datasets.yaml").read_text(encoding="utf-8"))
    return {name: raw[name] for name in DATASETS}


def _members(entries: dict[str, Any]) -> dict[str, dict[str, tuple[str, str, str]]]:
    """file -> member -> (format, split, lang), for every side of every corpus."""
    files: dict[str, dict[str, tuple[str, str, str]]] = {}
    for entry in entries.values():
        for pair in entry["pairs"].values():
            for split, corpora in pair["splits"].items():
                for corpus in corpora:
                    for lang, side in corpus.items():
                        if lang != "name":
                            files.setdefault(side["file"], {})[side["member"]] = (
                                side["format"], split, f"{corpus['name']}.{lang}"
                            )  # fmt: skip
    return files


def _text(corpus_lang: str, split: str) -> list[bytes]:
    corpus, lang = corpus_lang.rsplit(".", 1)
    if split == "train":
        lines = [f"{corpus} {lang} sentence number {i} about topic {i % 7}" for i in range(N)]
    else:
        lines = [f"{split} {lang} {i}: {t}" for i, t in enumerate(TRICKY)]
    out = [line.encode() + b"\n" for line in lines]
    if corpus == "commoncrawl":  # crawled text: one byte that is not UTF-8, one escape sequence
        if lang == "en":
            out[5] = b"caf\xe9 cr\xe8me br\xfbl\xe9e\n"
        else:
            out[9] = b"Farbe \x1b[31m rot\n"
    return out


def _sgml(lines: list[bytes], lang: str) -> bytes:
    """Two documents of WMT SGML (srcset/doc/p/seg), as in newstest2013/2014."""
    head = f'<srcset setid="newstest" srclang="any" trglang="{lang}">\n'.encode()
    out = [head]
    for d, chunk in enumerate((lines[:2], lines[2:])):
        out.append(f'<doc sysid="ref" docid="{d}-bbc" genre="news" origlang="en">\n<p>\n'.encode())
        for i, line in enumerate(chunk, 1 + 2 * d):
            out.append(f'<seg id="{i}">'.encode() + line.rstrip(b"\n") + b"</seg>\n")
        out.append(b"</p>\n</doc>\n")
    return b"".join([*out, b"</srcset>\n"])


def _build_archive(path: Path, members: dict[str, tuple[str, str, str]]) -> None:
    mode = "w:gz" if path.name.endswith(".tgz") else "w"
    with tarfile.open(path, mode) as tar:
        for member, (fmt, split, corpus_lang) in sorted(members.items()):
            lines = _text(corpus_lang, split)
            data = b"".join(lines)
            if fmt == "gzip":
                data = gzip.compress(data, mtime=0)
            elif fmt == "sgml":
                data = _sgml(lines, corpus_lang.rsplit(".", 1)[1])
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def wmt14(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("wmt14")
    site = root / "site"
    entries = _registry_entries()
    members = _members(entries)
    urls = {spec["url"] for e in entries.values() for spec in e["files"].values()}
    assert len(urls) == len(members)  # one URL per file name, shared by both datasets
    handler = functools.partial(_QuietHandler, directory=str(site))
    with local_http_server(handler) as server:
        for entry in entries.values():
            for name, spec in entry["files"].items():
                local = site / spec["url"].split("://", 1)[1].split("/", 1)[1]
                if not local.is_file():
                    local.parent.mkdir(parents=True, exist_ok=True)
                    _build_archive(local, members[name])
                spec["url"] = f"{server}/{local.relative_to(site)}"
                if spec.get("md5") is not None:  # sacrebleu's md5s belong to the real archives
                    spec["md5"] = hashlib.md5(local.read_bytes()).hexdigest()
        registry = root / "datasets.yaml"
        registry.write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")
        config = _config(registry)
        work = root / "work"
        work.mkdir()
        targets = [
            f"results/bin/{dataset}/{pair}/{split}.{lang}.{kind}.npy"
            for dataset, pair, splits in _splits(entries)
            for split in splits
            for lang in pair.split("-")
            for kind in ("tokens", "offsets")
        ]
        # -p (print commands): an option that ends the list of --configfile's values
        result = _snakemake(work, config, "-p", *targets)
        assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return {"work": work, "site": site, "entries": entries, "config": config, "log": result}


def _splits(entries: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    return [
        (dataset, pair, list(p["splits"]))
        for dataset, entry in entries.items()
        for pair, p in entry["pairs"].items()
    ]


def _config(registry: Path) -> dict[str, Any]:
    """The EN-DE and EN-FR base recipes in one config, with a vocabulary the fixtures can fill."""
    recipes = REPO_ROOT / "config" / "experiments"
    de = yaml.safe_load((recipes / "wmt14_en_de_base.yaml").read_text(encoding="utf-8"))
    fr = yaml.safe_load((recipes / "wmt14_en_fr_base.yaml").read_text(encoding="utf-8"))
    config = {**de, "registry": str(registry), "data_mirror": None}
    config["data"] = {**de["data"], **fr["data"]}
    config["experiments"] = {**de["experiments"], **fr["experiments"]}
    for pairs in config["data"].values():
        for settings in pairs.values():
            assert settings["clean"] == {}  # the recipes clean with the defaults: tested as such
            settings["vocab_size"] = 400  # byte fallback alone needs 256
    return config


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_download_verifies_md5_of_test_sets_and_pins_every_other_archive(wmt14):
    work, entries = wmt14["work"], wmt14["entries"]
    for dataset, entry in entries.items():
        raw = work / "resources" / dataset
        lock = json.loads((raw / "checksums.lock.json").read_text())
        assert set(lock) == set(entry["files"])  # training archives and md5-checked test sets
        for name in entry["files"]:
            assert lock[name] == hashlib.sha256((raw / name).read_bytes()).hexdigest()
            assert not (raw / f"{name}.part").exists()
        log = (work / "logs" / "download" / f"{dataset}.log").read_text()
        assert (
            f"test-full.tgz: verified by its published md5 {entry['files']['test-full.tgz']['md5']}"
            in log
        )
        assert (
            "training-parallel-nc-v9.tgz: no published checksum, this first download is "
            "trusted; pinned its sha256" in log
        )


def test_clean_reports_count_what_crawled_text_lost(wmt14):
    work, entries = wmt14["work"], wmt14["entries"]
    for dataset, pair, splits in _splits(entries):
        report = json.loads(
            (work / "results/data" / dataset / pair / "clean_report.json").read_text()
        )
        train = report["splits"]["train"]
        names = [c["name"] for c in entries[dataset]["pairs"][pair]["splits"]["train"]]
        assert sorted(train["corpora"]) == sorted(names)
        for name, counts in train["corpora"].items():
            broken = (1, 1) if name == "commoncrawl" else (0, 0)
            assert counts["read"] == N
            assert (counts["dropped"]["invalid_utf8"], counts["dropped"]["control_chars"]) == broken
            assert counts["kept"] == N - sum(broken)  # distinct, short, aligned: nothing else
        assert train["kept"] == N * len(names) - 2
        for split in splits[1:]:
            assert report["splits"][split]["read"] == report["splits"][split]["kept"] == 4


def test_every_split_is_line_aligned_and_encoded(wmt14):
    work = wmt14["work"]
    for dataset, pair, splits in _splits(wmt14["entries"]):
        src, tgt = pair.split("-")
        text = work / "results/data" / dataset / pair
        report = json.loads((text / "clean_report.json").read_text())
        for split in splits:
            n = report["splits"][split]["kept"]
            assert len(_lines(text / f"{split}.{src}")) == len(_lines(text / f"{split}.{tgt}")) == n
            for lang in (src, tgt):
                offsets = np.load(
                    work / "results/bin" / dataset / pair / f"{split}.{lang}.offsets.npy"
                )
                assert len(offsets) == n + 1  # one sentence per line
        train_en = _lines(text / f"train.{src}")
        assert not any("\ufffd" in line or "caf" in line for line in train_en)
        assert (work / "results/spm" / dataset / pair / "spm.model").stat().st_size > 0


def test_test_and_dev_sets_equal_sacrebleus_extraction_of_the_same_sgml(wmt14, tmp_path):
    from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

    work, entries = wmt14["work"], wmt14["entries"]
    extract = FakeSGMLDataset("fixture", data=[])._convert_format
    compared = 0
    for dataset, pair, splits in _splits(entries):
        for split in splits[1:]:  # valid (newstest2013) and newstest2014: SGML
            for corpus in entries[dataset]["pairs"][pair]["splits"][split]:
                for lang in pair.split("-"):
                    side = corpus[lang]
                    assert side["format"] == "sgml"
                    raw = work / "resources" / dataset / side["file"]
                    with tarfile.open(raw) as tar:
                        sgm = tmp_path / f"{compared}.sgm"
                        sgm.write_bytes(tar.extractfile(side["member"]).read())
                    extract(str(sgm), str(tmp_path / f"{compared}.txt"))
                    ours = _lines(work / "results/data" / dataset / pair / f"{split}.{lang}")
                    assert ours == _lines(tmp_path / f"{compared}.txt")
                    assert ours[1].startswith(f"{split} {lang} 1: They are not even 100 metres")
                    compared += 1
    assert compared == 8  # 2 pairs x (valid, test) x 2 languages


def test_a_damaged_download_names_the_file_and_the_forcerun_command(wmt14, tmp_path, capsys):
    from transformer_nmt.cli import main
    from transformer_nmt.data.clean import CleanConfig
    from transformer_nmt.data.prepare import prepare_pair
    from transformer_nmt.data.registry import get_dataset
    from transformer_nmt.errors import DataError

    work = wmt14["work"]
    raw = work / "resources" / "wmt14_en_fr"
    copy = tmp_path / "raw"
    copy.mkdir()
    for path in raw.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    giga = copy / "training-giga-fren.tar"
    with tarfile.open(giga) as tar:
        first = tar.next()
        cut = first.offset_data + first.size // 2
    giga.write_bytes(giga.read_bytes()[:cut])  # cut short inside its first member
    registry = work.parent / "datasets.yaml"
    argv = ["prepare", "--registry", str(registry), "--dataset", "wmt14_en_fr", "--pair",
            "en-fr", "--raw-dir", str(copy), "--out-dir", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {giga}: sha256 does not match the expected ")
    assert err.rstrip().endswith(
        "fetch the files again with `snakemake --forcerun download_wmt14_en_fr ...` (your usual "
        "snakemake arguments; it also pins unknown checksums afresh) (or delete the file's "
        "entry from the lock file)"
    )
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # past the checksum (e.g. a lock pinned on a bad first download): the archive itself
    dataset = get_dataset(registry, "wmt14_en_fr")
    with pytest.raises(
        DataError,
        match=rf"{giga}(:giga-fren\.release2\.fixed\.\w\w\.gz)?: (corrupt|truncated).*; fetch the "
        r"files again with `snakemake --forcerun download_wmt14_en_fr \.\.\.`",
    ):
        prepare_pair(
            dataset, "en-fr", copy, tmp_path / "out", CleanConfig(), verify_checksums=False
        )
