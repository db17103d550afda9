"""ModelConfig: presets, Table 3 rows, ``key=value`` overrides and validation."""

from __future__ import annotations

import pytest

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import (
    TABLE3,
    ModelConfig,
    apply_overrides,
    get_preset,
    table3_config,
)


def test_presets_match_the_paper():
    base = get_preset("base")
    assert (base.N, base.d_model, base.d_ff, base.h, base.d_k, base.d_v) == (
        6,
        512,
        2048,
        8,
        64,
        64,
    )
    assert (base.p_drop, base.eps_ls, base.p_drop_attn, base.p_drop_relu) == (0.1, 0.1, 0.0, 0.0)
    assert base.positional == "sinusoidal" and not base.norm_first and base.tie_embeddings
    assert not base.attention_bias  # §3.2.2: bias-free projections
    big = get_preset("big")
    assert (big.N, big.d_model, big.d_ff, big.h, big.d_k, big.d_v, big.p_drop) == (
        6,
        1024,
        4096,
        16,
        64,
        64,
        0.3,
    )
    assert get_preset("tiny").d_model < base.d_model


def test_overrides_parse_by_field_type():
    cfg = apply_overrides(
        get_preset("base"),
        ["h=1", "d_k=512", "d_v=512", "p_drop=0.2", "norm_first=true", "positional=learned"],
    )
    assert (cfg.h, cfg.d_k, cfg.d_v, cfg.p_drop) == (1, 512, 512, 0.2)
    assert cfg.norm_first is True and cfg.positional == "learned"
    assert get_preset("base").h == 8  # presets are not modified
    assert apply_overrides(get_preset("base"), {"N": 2}).N == 2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("heads=4", "'heads'"),
        ("h=four", "'h' expects int"),
        ("h=2.5", "'h' expects int"),
        ("h=0", "'h' must be a positive integer"),
        ("p_drop=1.0", "'p_drop' must be a number in \\[0, 1\\)"),
        ("p_drop=-0.1", "'p_drop'"),
        ("positional=rotary", "'positional' must be one of"),
        ("norm_first=maybe", "'norm_first' expects bool"),
        ("d_model", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(get_preset("base"), [override])


def test_dict_round_trip_and_unknown_keys():
    cfg = apply_overrides(get_preset("big"), ["positional=learned", "max_positions=256"])
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    data = cfg.to_dict() | {"dropout": 0.1}
    with pytest.raises(ConfigError, match="'dropout'"):
        ModelConfig.from_dict(data)


def test_unknown_preset_and_table3_row():
    with pytest.raises(ConfigError, match="'huge'"):
        get_preset("huge")
    with pytest.raises(ConfigError, match="'F1'"):
        table3_config("F1")


def test_table3_rows_are_overrides_of_base():
    assert table3_config("A1").h == 1 and table3_config("A1").d_k == 512
    assert table3_config("B1").d_k == 16 and table3_config("B1").d_v == 64
    assert table3_config("E").positional == "learned"
    big = table3_config("big")
    assert (big.d_model, big.d_ff, big.h, big.p_drop) == (1024, 4096, 16, 0.3)
    assert {name[0] for name in TABLE3} >= set("ABCDE")
