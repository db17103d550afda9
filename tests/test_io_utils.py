"""Atomic writes: the target appears whole or not at all, with ordinary file permissions."""

from __future__ import annotations

import json
import os
import stat

import pytest

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import atomic_open, read_json, write_json


def test_failed_write_leaves_neither_target_nor_temp_file(tmp_path) -> None:
    target = tmp_path / "out.txt"
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []


def test_failed_rewrite_keeps_the_previous_version(tmp_path) -> None:
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(ValueError), atomic_open(target) as handle:
        handle.write("{broken")
        raise ValueError
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_output_mode_follows_the_umask_not_mkstemp(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", [1])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_stream_line_batches_split_on_newline_only_and_hand_over_on_pause() -> None:
    import io
    import threading

    from transformer_nmt.errors import DataError
    from transformer_nmt.io_utils import stream_line_batches

    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb", buffering=0) as reader, open(write_fd, "wb", buffering=0) as writer:
        batches = stream_line_batches(reader, max_lines=2, pause_s=0.05)
        writer.write("a\u2028b\r\nc\x0cd\x85e\nf\rg\nh".encode())
        assert next(batches) == ["a\u2028b", "c\x0cd\x85e"]  # full batch of 2
        assert next(batches) == ["f\rg"]  # input paused: the one complete line so far
        timer = threading.Timer(0.2, lambda: (writer.write(b"\n\n"), writer.close()))
        timer.start()
        assert list(batches) == [["h", ""]]  # the partial line completes, then end of input
        timer.join()

    fallback = stream_line_batches(io.BytesIO(b"x\ny\r\nz"), max_lines=2)  # no descriptor
    assert list(fallback) == [["x", "y"], ["z"]]
    with pytest.raises(DataError, match=r"^<stdin>:3: invalid UTF-8"):
        list(stream_line_batches(io.BytesIO(b"ok\nok\n\xc3(\n"), max_lines=10))


def test_read_json_names_the_file_for_each_kind_of_bad_input(tmp_path) -> None:
    good = tmp_path / "good.json"
    write_json(good, {"a": [1, 2]})
    assert read_json(good) == {"a": [1, 2]}
    with pytest.raises(DataError, match=r"missing\.json: file not found \(train first\)$"):
        read_json(tmp_path / "missing.json", missing="train first")
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.json: not valid JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(DataError, match=r"latin1\.json: not valid JSON"):
        read_json(tmp_path / "latin1.json")
    with pytest.raises(DataError, match=r": cannot be read"):
        read_json(tmp_path)  # a directory
