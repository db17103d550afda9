"""check-config: a config file's YAML syntax error names its file, line and column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transformer_nmt.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_a_yaml_syntax_error_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "my config.yaml"
    bad.write_text("experiments:\n  a:\n    dataset: multi30k\n   pair: en-de\n", encoding="utf-8")
    assert main(["check-config", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {bad}:4:4: not valid YAML: expected <block end>")
    assert "at line 2, column 3" in line and "fix it there" in line


def test_a_schema_error_names_the_key_and_a_valid_config_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    broken, replaced = re.subn(r"max_steps: \d+", "max_steps: -3", config, count=1)
    assert replaced == 1
    bad.write_text(broken, encoding="utf-8")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: config: experiments.multi30k_en_de_tiny.train.max_steps:" in err
    assert main(["check-config", str(REPO / "config" / "config.yaml")]) == 0
    assert "valid (1 experiment(s): multi30k_en_de_tiny)" in capsys.readouterr().out
