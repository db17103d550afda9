"""Atomic writes: the target appears whole or not at all, with ordinary file permissions."""

from __future__ import annotations

import json
import os
import stat

import pytest

from transformer_nmt.io_utils import atomic_open, write_json


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
