"""Progress lines where people look: log lines (not a tqdm bar) when stderr is a log file."""

from __future__ import annotations

import logging

import pytest

from transformer_nmt.progress import Progress


class NotATty:
    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        raise AssertionError("no progress bar may be drawn into a log file")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "transformer_nmt.progress"]


def test_known_total_logs_every_tenth_in_scaled_units(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="transformer_nmt.progress")
    with Progress(50_000_000, "x.tgz", unit="MB", scale=1e6, stream=NotATty()) as progress:
        for _ in range(50):
            progress(1_000_000)
    lines = messages(caplog)
    assert len(lines) == 10
    assert lines[0].startswith("x.tgz: 5.0/50.0 MB (10%), ")
    assert lines[-1].startswith("x.tgz: 50.0/50.0 MB (100%), ")
    assert lines[-1].endswith(" MB/s, ETA 0:00:00")


def test_a_resumed_download_shows_speed_of_this_run_eta_and_a_line_every_s(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformer_nmt import progress as module

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger="transformer_nmt.progress")
    # 400 of 1000 MB were there before (a .part file): 2 MB per second from here on
    progress = Progress(
        1000_000_000, "big.tar", unit="MB", scale=1e6, initial=400_000_000, every_s=30,
        stream=NotATty(),
    )  # fmt: skip
    for _ in range(40):  # 40 s at 2 MB/s: 480 MB, not yet the next tenth (500 MB)
        clock[0] += 1
        progress(2_000_000)
    clock[0] += 1
    progress(20_000_000)  # 500 MB: the 50% line
    assert messages(caplog) == [
        "big.tar: 460.0/1000.0 MB (46%), 2.0 MB/s, ETA 0:04:30",  # 30 s without a line
        "big.tar: 500.0/1000.0 MB (50%), 2.4 MB/s, ETA 0:03:25",
    ]


def test_unknown_total_logs_every_report_every_units(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="transformer_nmt.progress")
    progress = Progress(None, "stream", unit="MB", scale=1e6, report_every=3, stream=NotATty())
    for _ in range(10):
        progress(1)
    progress.close()
    assert [line.split(",")[0] for line in messages(caplog)] == [
        "stream: 0.0 MB",  # 3 bytes shown in MB
        "stream: 0.0 MB",
        "stream: 0.0 MB",
    ]


def test_a_mirror_download_into_a_log_file_reports_progress(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformer_nmt.data import download
    from transformer_nmt.data.registry import FileSpec
    from transformer_nmt.io_utils import sha256_file

    mirror = tmp_path / "mirror" / "toy"
    mirror.mkdir(parents=True)
    (mirror / "big.bin").write_bytes(bytes(range(256)) * 40_000)  # 10.24 MB
    # pytest captures stderr: like a Snakemake log file, it is no terminal
    caplog.set_level(logging.INFO, logger="transformer_nmt.progress")
    spec = FileSpec("big.bin", "https://example.invalid/big.bin", None)
    sha = download.download_file(
        spec, "toy", tmp_path / "out", mirror=tmp_path / "mirror", expected=None
    )
    assert sha == sha256_file(mirror / "big.bin")
    lines = messages(caplog)
    assert len(lines) == 10 and lines[-1].startswith("big.bin: 10.2/10.2 MB (100%)")
