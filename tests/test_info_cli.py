"""``python -m transformer_nmt info``: resolved config and parameter counts as JSON."""

from __future__ import annotations

import json

from transformer_nmt.cli import main


def run_info(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["info", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_info_prints_config_and_counts(capsys):
    code, out, _ = run_info(
        capsys, "--preset", "base", "--vocab-size", "37000", "--set", "h=1", "--set", "d_k=512",
        "--set", "d_v=512",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["config"]["h"] == 1 and data["config"]["d_k"] == 512
    assert data["config"]["d_model"] == 512 and data["config"]["N"] == 6
    # h * d_k = d_model: the same count as base (Table 3 row A); embeddings 37000 * 512
    assert data["parameters"] == 63_045_632
    assert data["parameters"] - data["parameters_without_embeddings"] == 37000 * 512


def test_info_untied_target_vocabulary(capsys):
    code, out, _ = run_info(
        capsys, "--preset", "tiny", "--vocab-size", "1000", "--tgt-vocab-size", "500",
        "--set", "tie_embeddings=false",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    d_model = data["config"]["d_model"]
    # source embedding, target embedding and output projection are separate
    embeddings = data["parameters"] - data["parameters_without_embeddings"]
    assert embeddings == 1000 * d_model + 2 * 500 * d_model


def test_info_table3_lists_every_row_within_7_percent(capsys):
    code, out, _ = run_info(capsys, "--table3")
    assert code == 0
    rows = json.loads(out)["table3"]
    assert {row["row"] for row in rows} >= {"base", "A1", "B1", "C1", "C7", "D4", "E", "big"}
    assert all(abs(row["relative_difference"]) <= 0.07 for row in rows)
    big = next(row for row in rows if row["row"] == "big")
    assert big["paper_params_m"] == 213 and 200e6 < big["parameters"] < 226e6


def test_info_bad_override_is_a_clear_error(capsys):
    code, out, err = run_info(capsys, "--set", "heads=4")
    assert code == 2 and out == ""
    assert "error: unknown model config key 'heads'" in err
    code, _, err = run_info(capsys, "--vocab-size", "0")
    assert code == 2 and "--vocab-size" in err
