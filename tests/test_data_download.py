"""Dataset registry and verified downloads: mirror, lock file, HTTP errors, retries."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from transformer_nmt.cli import main
from transformer_nmt.data.download import LOCK_NAME, download_dataset
from transformer_nmt.data.registry import get_dataset, load_registry
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.io_utils import sha256_file

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = b"ein Satz\nnoch ein Satz\n"
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_shipped_registry_matches_the_mirror_checksums(shared_mirror):
    registry = load_registry(REPO / "config" / "datasets.yaml")
    assert set(registry) == {"multi30k", "wmt14_en_de", "wmt14_en_fr"}
    m30k = registry["multi30k"]
    sums = dict(
        reversed(line.split())
        for line in (shared_mirror / "multi30k" / "SHA256SUMS").read_text().splitlines()
    )
    assert {name: spec.sha256 for name, spec in m30k.files.items()} == sums
    assert set(m30k.pairs) == {"en-de", "en-fr"}
    assert list(m30k.pairs["en-de"].splits) == [
        "train",
        "valid",
        "test_2016_flickr",
        "test_2017_flickr",
    ]
    de = registry["wmt14_en_de"].pairs["en-de"]
    assert [c.name for c in de.splits["train"]] == [
        "europarl_v7",
        "commoncrawl",
        "news_commentary_v9",
    ]
    assert de.splits["newstest2014"][0].sides["de"].format == "sgml"
    fr = registry["wmt14_en_fr"].pairs["en-fr"]
    assert {"un", "giga_fren"} <= {c.name for c in fr.splits["train"]}
    assert all(spec.sha256 is None for spec in registry["wmt14_en_fr"].files.values())


def _registry(tmp_path: Path, files: dict, extra_pair_key: dict | None = None) -> Path:
    corpus = {"name": "c", "en": {"file": "a.txt", "format": "text"}}
    corpus["de"] = {"file": "a.txt", "format": "text"}
    pair = {"splits": {"train": [corpus], "valid": [corpus]}, **(extra_pair_key or {})}
    path = tmp_path / "datasets.yaml"
    path.write_text(yaml.safe_dump({"toy": {"files": files, "pairs": {"en-de": pair}}}))
    return path


@pytest.mark.parametrize(
    ("files", "extra", "message"),
    [
        ({"a.txt": {"url": "u", "sha256": "xyz"}}, None, r"toy\.files\.a\.txt\.sha256"),
        ({"a.txt": {"url": "u", "sha256": None, "md5": 1}}, None, r"unknown key.*md5"),
        ({"a.txt": {"url": "u", "sha256": None}}, {"colour": 1}, r"pairs\.en-de.*colour"),
    ],
)
def test_registry_errors_name_the_key(tmp_path, files, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_registry(_registry(tmp_path, files, extra))


def test_unknown_dataset_and_pair(tmp_path):
    path = _registry(tmp_path, {"a.txt": {"url": "u", "sha256": None}})
    with pytest.raises(ConfigError, match="no dataset 'nope'"):
        get_dataset(path, "nope")
    with pytest.raises(ConfigError, match="no pair 'en-fr'"):
        get_dataset(path, "toy").pair("en-fr")


def _mirror(tmp_path: Path, content: bytes = PAYLOAD) -> Path:
    mirror = tmp_path / "mirror"
    (mirror / "toy").mkdir(parents=True)
    (mirror / "toy" / "a.txt").write_bytes(content)
    return mirror


def test_mirror_download_verifies_sha256(tmp_path):
    ds = get_dataset(
        _registry(tmp_path, {"a.txt": {"url": "http://x.invalid/a", "sha256": SHA}}), "toy"
    )
    out = tmp_path / "out"
    assert download_dataset(ds, out, mirror=_mirror(tmp_path)) == {"a.txt": SHA}
    assert (out / "a.txt").read_bytes() == PAYLOAD
    # sums known in advance pin nothing (the lock is still written: a pipeline output)
    assert json.loads((out / LOCK_NAME).read_text()) == {}


def test_checksum_mismatch_leaves_nothing(tmp_path):
    wrong = "0" * 64
    ds = get_dataset(
        _registry(tmp_path, {"a.txt": {"url": "http://x.invalid/a", "sha256": wrong}}), "toy"
    )
    out = tmp_path / "out"
    with pytest.raises(
        DataError, match=rf"mirror/toy/a\.txt: sha256 {SHA} does not match .*{wrong}"
    ):
        download_dataset(ds, out, mirror=_mirror(tmp_path))
    assert list(out.iterdir()) == []


def test_missing_mirror_file_and_directory(tmp_path):
    ds = get_dataset(
        _registry(tmp_path, {"a.txt": {"url": "http://x.invalid/a", "sha256": SHA}}), "toy"
    )
    mirror = tmp_path / "mirror"
    (mirror / "toy").mkdir(parents=True)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"mirror/toy/a\.txt: file missing from the mirror"):
        download_dataset(ds, out, mirror=mirror)
    assert list(out.iterdir()) == []
    with pytest.raises(DataError, match=r"mirror directory .*elsewhere does not exist"):
        download_dataset(ds, out, mirror=tmp_path / "elsewhere")


def test_lock_file_records_first_download_and_guards_later_ones(tmp_path):
    ds = get_dataset(
        _registry(tmp_path, {"a.txt": {"url": "http://x.invalid/a", "sha256": None}}), "toy"
    )
    out = tmp_path / "out"
    mirror = _mirror(tmp_path)
    download_dataset(ds, out, mirror=mirror)
    assert json.loads((out / LOCK_NAME).read_text()) == {"a.txt": SHA}
    # the file is damaged locally, and the mirror now serves different bytes
    (out / "a.txt").write_bytes(b"tampered")
    changed = tmp_path / "changed"
    (changed / "toy").mkdir(parents=True)
    (changed / "toy" / "a.txt").write_bytes(b"other bytes\n")
    with pytest.raises(
        DataError,
        match=rf"changed/toy/a\.txt: sha256 .* expected {SHA}; the expected sha256 was pinned "
        rf"by the first download in .*out/{LOCK_NAME}; .*snakemake --forcerun download_toy",
    ):
        download_dataset(ds, out, mirror=changed)
    assert (out / "a.txt").read_bytes() == b"tampered"  # untouched; no temp files
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", LOCK_NAME]
    download_dataset(ds, out, mirror=mirror)  # the right bytes repair it
    assert (out / "a.txt").read_bytes() == PAYLOAD


def test_a_truncated_first_download_is_never_pinned(tmp_path):
    import gzip

    good = gzip.compress(b"line one\nline two\n" * 2000)
    files = {
        "a.txt": {"url": "http://x.invalid/a", "sha256": SHA},
        "a.gz": {"url": "http://x.invalid/a.gz", "sha256": None},
    }
    ds = get_dataset(_registry(tmp_path, files), "toy")
    mirror = _mirror(tmp_path)
    (mirror / "toy" / "a.gz").write_bytes(good[: len(good) // 2])  # cut short
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"a\.gz: the download is not a complete \.gz archive"):
        download_dataset(ds, out, mirror=mirror)
    assert not (out / "a.gz").exists()
    assert not (out / LOCK_NAME).exists() or json.loads((out / LOCK_NAME).read_text()) == {}
    (mirror / "toy" / "a.gz").write_bytes(good)  # a good source: downloads and pins
    download_dataset(ds, out, mirror=mirror)
    assert json.loads((out / LOCK_NAME).read_text()) == {"a.gz": sha256_file(out / "a.gz")}
    assert gzip.decompress((out / "a.gz").read_bytes()) == gzip.decompress(good)


def test_cli_takes_mirror_from_environment(tmp_path, monkeypatch, capsys):
    reg = _registry(tmp_path, {"a.txt": {"url": "http://x.invalid/a", "sha256": SHA}})
    monkeypatch.setenv("TRANSFORMER_NMT_MIRROR", str(_mirror(tmp_path)))
    out = tmp_path / "out"
    argv = ["download", "--registry", str(reg), "--dataset", "toy", "--out-dir", str(out)]
    assert main(argv) == 0
    assert (out / "a.txt").read_bytes() == PAYLOAD
    monkeypatch.setenv("TRANSFORMER_NMT_MIRROR", str(tmp_path / "gone"))
    (out / "a.txt").unlink()
    assert main(argv) == 2
    assert "error: mirror directory" in capsys.readouterr().err


class _Handler(http.server.BaseHTTPRequestHandler):
    flaky_left = 0
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        type(self).hits.append(self.path)
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/flaky" and type(self).flaky_left > 0:
            type(self).flaky_left -= 1
            self.send_error(503)
            return
        if self.path in ("/ok", "/flaky", "/slow"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError):  # a /slow client may have given up
                self.wfile.write(PAYLOAD)
            return
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.hits = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _url_dataset(tmp_path, url, sha=SHA):
    return get_dataset(_registry(tmp_path, {"a.txt": {"url": url, "sha256": sha}}), "toy")


def test_http_download_and_retry_after_server_errors(tmp_path, server):
    out = tmp_path / "out"
    assert download_dataset(_url_dataset(tmp_path, f"{server}/ok"), out) == {"a.txt": SHA}
    (out / "a.txt").unlink()
    _Handler.flaky_left = 2
    download_dataset(_url_dataset(tmp_path, f"{server}/flaky"), out, retries=3, backoff=0.01)
    assert (out / "a.txt").read_bytes() == PAYLOAD
    assert _Handler.hits.count("/flaky") == 3  # two 503s, then success


def test_http_404_fails_at_once_naming_the_url(tmp_path, server):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"{server}/gone: HTTP 404"):
        download_dataset(_url_dataset(tmp_path, f"{server}/gone"), out, retries=3, backoff=0.01)
    assert _Handler.hits == ["/gone"]  # a 404 is not retried
    assert list(out.iterdir()) == []


def test_http_timeout_and_unreachable_host_after_retries(tmp_path, server):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"{server}/slow: download failed after 2 attempts"):
        download_dataset(
            _url_dataset(tmp_path, f"{server}/slow"), out, timeout=0.2, retries=1, backoff=0.01
        )
    assert list(out.iterdir()) == []
    dead = "http://127.0.0.1:9/a"  # discard port: connection refused
    with pytest.raises(
        DataError, match="127.0.0.1:9/a: download failed after 1 attempts.*data_mirror"
    ):
        download_dataset(_url_dataset(tmp_path, dead), out, retries=0)
    assert list(out.iterdir()) == []
