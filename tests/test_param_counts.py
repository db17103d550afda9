"""Table 3: our parameter counts with a 37,000-token shared vocabulary are within 7% of the
paper's for every row. Models are built on the meta device (no memory, no real init)."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.model import (
    TABLE3,
    Transformer,
    apply_overrides,
    count_parameters,
    table3_config,
)


def params_of(name: str) -> int:
    with torch.device("meta"):
        return count_parameters(Transformer(table3_config(name), vocab_size=37000))


@pytest.mark.parametrize("name", list(TABLE3))
def test_table3_parameter_counts_within_7_percent(name):
    paper = TABLE3[name].paper_params_m * 1e6
    ours = params_of(name)
    assert abs(ours - paper) / paper <= 0.07, f"{name}: {ours / 1e6:.1f}M vs paper {paper / 1e6}M"


def test_base_count_by_hand():
    # shared embedding V*d_model; encoder layer: 4 bias-free attention projections (§3.2.2), FFN,
    # 2 LayerNorms; decoder layer: 8 projections, FFN, 3 LayerNorms.
    d, d_ff, V, N = 512, 2048, 37000, 6
    attention = 4 * d * d
    ffn = d * d_ff + d_ff + d_ff * d + d
    expected = V * d + N * (attention + ffn + 2 * 2 * d) + N * (2 * attention + ffn + 3 * 2 * d)
    assert params_of("base") == expected == 63_045_632


def test_attention_bias_flag_adds_four_biases_per_attention():
    with torch.device("meta"):
        biased = Transformer(
            apply_overrides(table3_config("base"), ["attention_bias=true"]), vocab_size=37000
        )
    assert count_parameters(biased) - params_of("base") == 18 * 4 * 512  # 6 + 2*6 attentions
