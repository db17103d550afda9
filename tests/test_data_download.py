"""Dataset registry and verified downloads: mirror, lock file, HTTP errors, retries."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import logging
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import local_http_server
from transformer_nmt.cli import main
from transformer_nmt.data.download import LOCK_NAME, download_dataset
from transformer_nmt.data.registry import get_dataset, load_registry
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.io_utils import sha256_file, write_json

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
        ({"a.txt": {"url": "u", "sha256": None, "sha1": 1}}, None, r"unknown key.*sha1"),
        ({"a.txt": {"url": "u", "sha256": None, "md5": 1}}, None, r"a\.txt\.md5: expected 32"),
        (
            {"a.txt": {"url": "https://x.invalid/a.tgz", "sha256": None, "md5": "sacrebleu"}},
            None,
            r"a\.txt\.md5: md5 'sacrebleu', but sacrebleu [\d.]+ pins no md5 for "
            r"https://x\.invalid/a\.tgz",
        ),
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
    _Handler.hits = []
    with local_http_server(_Handler) as url:
        yield url


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


# --- resumable downloads: a server on 127.0.0.1 that cuts, ignores Range or serves other bytes --

BIG = bytes(range(256)) * 1200  # 307,200 bytes
BIG_SHA = hashlib.sha256(BIG).hexdigest()
CUT = 100_000  # where a cut connection stops
ETAG = '"v1"'


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """/cut: the first response stops after CUT bytes, Range requests are honoured.
    /norange: the first response stops after CUT bytes, Range requests are ignored (200).
    /down: the first response stops after CUT bytes, every later request is a 503 until
    ``up`` is set. /wrong: other bytes. /flaky: every response stops after CUT bytes, Range
    requests are ignored."""

    requests: list[tuple[str, str | None, str | None]] = []
    up = False

    def do_GET(self):  # noqa: N802 (http.server's naming)
        cls = type(self)
        rng, if_range = self.headers.get("Range"), self.headers.get("If-Range")
        cls.requests.append((self.path, rng, if_range))
        first = sum(1 for p, _, _ in cls.requests if p == self.path) == 1
        body = b"other bytes, same length".ljust(len(BIG), b".") if self.path == "/wrong" else BIG
        if self.path == "/down" and not first and not cls.up:
            self.send_error(503)
            return
        start = 0
        if rng and self.path not in ("/norange", "/flaky") and if_range in (None, ETAG):
            start = int(rng.removeprefix("bytes=").removesuffix("-"))
        if start >= len(body):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.send_header("ETag", ETAG)
        self.end_headers()
        end = CUT if (first and self.path != "/wrong") or self.path == "/flaky" else len(body)
        self.close_connection = True
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body[start:end])

    def log_message(self, *args):
        pass


@pytest.fixture
def range_server():
    _RangeHandler.requests, _RangeHandler.up = [], False
    with local_http_server(_RangeHandler) as url:
        yield url


def test_a_cut_download_continues_with_a_range_request(tmp_path, range_server, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "out"
    ds = _url_dataset(tmp_path, f"{range_server}/cut", sha=BIG_SHA)
    assert download_dataset(ds, out, retries=0, backoff=0.01) == {"a.txt": BIG_SHA}
    assert (out / "a.txt").read_bytes() == BIG
    assert _RangeHandler.requests == [("/cut", None, None), ("/cut", f"bytes={CUT}-", ETAG)]
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", LOCK_NAME]  # no .part left
    assert f"continuing at 0.1 MB of {out / 'a.txt.part'}" in caplog.text


def test_a_server_ignoring_range_restarts_from_zero_and_says_so(tmp_path, range_server, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "out"
    ds = _url_dataset(tmp_path, f"{range_server}/norange", sha=BIG_SHA)
    download_dataset(ds, out, retries=0, backoff=0.01)
    assert (out / "a.txt").read_bytes() == BIG
    assert [r[1] for r in _RangeHandler.requests] == [None, f"bytes={CUT}-"]
    assert (
        f"/norange: the server ignored the Range request for bytes {CUT}- (or the file changed "
        "there); restarting the download from zero" in caplog.text
    )


def test_a_server_that_cuts_before_the_furthest_point_so_far_uses_up_the_retries(
    tmp_path, range_server
):
    """Data received is progress only when the file gets further than it ever was: a server
    that ignores Range and always cuts at the same byte ends in an error, not in a loop."""
    out = tmp_path / "out"
    ds = _url_dataset(tmp_path, f"{range_server}/flaky", sha=BIG_SHA)
    with pytest.raises(DataError, match=r"/flaky: download failed after 3 attempts"):
        download_dataset(ds, out, retries=2, backoff=0.01)
    assert len(_RangeHandler.requests) == 4  # the first (progress), then 3 that made none


def test_the_part_file_outlives_a_failed_run_and_the_next_run_continues(tmp_path, range_server):
    out = tmp_path / "out"
    ds = _url_dataset(tmp_path, f"{range_server}/down", sha=None)
    with pytest.raises(
        DataError,
        match=r"/down: download failed after 3 attempts: HTTP 503.*the 0\.1 MB received are "
        r"kept in .*out/a\.txt\.part, the next run continues there",
    ):
        download_dataset(ds, out, retries=2, backoff=0.01)
    assert (out / "a.txt.part").read_bytes() == BIG[:CUT]
    assert not (out / "a.txt").exists()
    _RangeHandler.up = True
    assert download_dataset(ds, out, retries=0) == {"a.txt": BIG_SHA}
    assert (out / "a.txt").read_bytes() == BIG
    assert _RangeHandler.requests[-1] == ("/down", f"bytes={CUT}-", ETAG)
    assert json.loads((out / LOCK_NAME).read_text()) == {"a.txt": BIG_SHA}  # pinned whole


def test_a_part_that_is_already_whole_is_not_fetched_again(tmp_path, range_server):
    out = tmp_path / "out"
    out.mkdir()
    url = f"{range_server}/cut"
    (out / "a.txt.part").write_bytes(BIG)  # a run killed between the last byte and the rename
    (out / "a.txt.part.json").write_text(json.dumps({"url": url, "etag": ETAG}))
    assert download_dataset(_url_dataset(tmp_path, url, sha=BIG_SHA), out) == {"a.txt": BIG_SHA}
    assert _RangeHandler.requests == [("/cut", f"bytes={len(BIG)}-", ETAG)]  # answered 416


def test_a_wrong_file_is_a_checksum_error_naming_it_and_is_never_resumed(tmp_path, range_server):
    out = tmp_path / "out"
    url = f"{range_server}/wrong"
    with pytest.raises(
        DataError, match=rf"{url}: sha256 [0-9a-f]{{64}} does not match .*{BIG_SHA}"
    ):
        download_dataset(_url_dataset(tmp_path, url, sha=BIG_SHA), out, retries=0)
    assert sorted(p.name for p in out.iterdir()) == []  # neither the file nor a .part
    # a checksum pinned by an earlier download: the error says how to fetch and pin afresh
    write_json(out / LOCK_NAME, {"a.txt": BIG_SHA})
    with pytest.raises(
        DataError,
        match=rf"{url}: sha256 .* expected {BIG_SHA}; the expected sha256 was pinned by the first "
        r"download in .*checksums\.lock\.json; if that download was bad, fetch the files again "
        r"with `snakemake --forcerun download_toy \.\.\.`",
    ):
        download_dataset(_url_dataset(tmp_path, url, sha=None), out, retries=0)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


def test_backoff_doubles_between_failed_attempts_up_to_a_minute(tmp_path, range_server):
    from transformer_nmt.data import transfer

    _RangeHandler.requests = [("/down", None, None)]  # as if the first request had been served
    sleeps: list[float] = []
    with pytest.raises(DataError, match="failed after 8 attempts"):
        transfer.fetch_url(
            f"{range_server}/down", tmp_path / "x.part", timeout=5, retries=7, backoff=1.0,
            sleep=sleeps.append,
        )  # fmt: skip
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_md5_checks_downloads_and_the_sha256_is_pinned_beside_it(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    md5 = hashlib.md5(PAYLOAD).hexdigest()
    spec = {"url": "http://x.invalid/a", "sha256": None, "md5": "0" * 32}
    out = tmp_path / "out"
    with pytest.raises(
        DataError, match=r"mirror/toy/a\.txt: md5 [0-9a-f]{32} does not match the published 0{32}"
    ):
        download_dataset(
            get_dataset(_registry(tmp_path, {"a.txt": spec}), "toy"), out, mirror=_mirror(tmp_path)
        )
    assert list(out.iterdir()) == []
    ds = get_dataset(_registry(tmp_path, {"a.txt": {**spec, "md5": md5}}), "toy")
    download_dataset(ds, out, mirror=tmp_path / "mirror")
    assert json.loads((out / LOCK_NAME).read_text()) == {"a.txt": SHA}
    assert f"a.txt: verified by its published md5 {md5}; pinned its sha256 {SHA}" in caplog.text


def test_a_first_download_without_checksum_is_pinned_and_the_log_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    ds = get_dataset(
        _registry(tmp_path, {"a.txt": {"url": "http://x.invalid", "sha256": None}}), "toy"
    )
    out = tmp_path / "out"
    download_dataset(ds, out, mirror=_mirror(tmp_path))
    assert (
        f"a.txt: no published checksum, this first download is trusted; pinned its sha256 {SHA} "
        f"in {out / LOCK_NAME}" in caplog.text
    )
    empty = _mirror(tmp_path / "e", b"")
    with pytest.raises(DataError, match=r"e/mirror/toy/a\.txt: the download is empty"):
        download_dataset(ds, tmp_path / "out2", mirror=empty)


def test_wmt14_test_sets_carry_sacrebleus_md5():
    from sacrebleu.dataset import DATASETS

    registry = load_registry(REPO / "config" / "datasets.yaml")
    for name in ("wmt14_en_de", "wmt14_en_fr"):
        files = registry[name].files
        for ours, theirs in (("test-full.tgz", "wmt14/full"), ("wmt13-test.tgz", "wmt13")):
            assert files[ours].url == DATASETS[theirs].data[0]
            assert files[ours].md5 == DATASETS[theirs].md5[0]
    assert registry["wmt14_en_de"].files["test-full.tgz"].md5.startswith("a8cd784e")
