"""Checkpoint discovery, averaging (§6.1), model files and the ``average`` CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.errors import CheckpointError
from transformer_nmt.model.config import apply_overrides, get_preset
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs import checkpoints as ck

CFG = apply_overrides(
    get_preset("tiny"), {"N": 1, "d_model": 16, "d_ff": 32, "h": 2, "d_k": 8, "d_v": 8}
)
VOCAB = {"size": 40, "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3, "sha256": "ab" * 32}


def lightning_like_checkpoint(path: Path, step: int, seed: int, dtype=torch.float32) -> dict:
    """A file shaped like a Lightning checkpoint of ``TranslationModule`` (model.* weights)."""
    torch.manual_seed(seed)
    model = Transformer(CFG, vocab_size=VOCAB["size"], pad_id=0).to(dtype)
    payload = {
        "global_step": step,
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model_config": CFG.to_dict(), "vocab": dict(VOCAB)},
        "optimizer_states": [],
    }
    torch.save(payload, path)
    return model.state_dict()


def test_list_checkpoints_sorts_by_step_and_ignores_other_files(tmp_path: Path) -> None:
    for name in ["step=00000100.ckpt", "step=00000020.ckpt", "step=00001000.ckpt"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "last.ckpt").write_bytes(b"x")
    (tmp_path / ".step=00002000.ckpt.tmp").write_bytes(b"x")
    names = [p.name for p in ck.list_checkpoints(tmp_path)]
    assert names == ["step=00000020.ckpt", "step=00000100.ckpt", "step=00001000.ckpt"]
    assert ck.list_checkpoints(tmp_path / "missing") == []
    assert ck.checkpoint_name(1000) == "step=00001000.ckpt"
    assert ck.checkpoint_step("step=00001000.ckpt") == 1000


def test_average_is_the_elementwise_mean(tmp_path: Path) -> None:
    states = [
        lightning_like_checkpoint(tmp_path / ck.checkpoint_name(s), s, seed=s) for s in (1, 2, 3)
    ]
    avg = ck.average_checkpoints([tmp_path / ck.checkpoint_name(s) for s in (1, 2, 3)])
    assert avg.keys() == states[0].keys()
    for key, value in avg.items():
        expected = (states[0][key] + states[1][key] + states[2][key]) / 3
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)
        assert value.dtype == torch.float32


def test_average_accumulates_in_fp32_and_keeps_the_dtype(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        path = tmp_path / ck.checkpoint_name(i + 1)
        lightning_like_checkpoint(path, i + 1, seed=i, dtype=torch.bfloat16)
        paths.append(path)
    states = [ck.model_state_dict(ck.load_checkpoint(p), p) for p in paths]
    avg = ck.average_checkpoints(paths)
    key = "src_embed.weight"
    exact = sum(s[key].float() for s in states) / 4
    assert avg[key].dtype == torch.bfloat16
    # One rounding to bf16 at the end (not one per addition): the nearest bf16 of the mean.
    torch.testing.assert_close(avg[key], exact.to(torch.bfloat16), rtol=0, atol=0)


def test_average_refuses_mismatched_keys_or_shapes(tmp_path: Path) -> None:
    a, b = tmp_path / "step=00000001.ckpt", tmp_path / "step=00000002.ckpt"
    lightning_like_checkpoint(a, 1, seed=1)
    lightning_like_checkpoint(b, 2, seed=2)
    payload = torch.load(b, weights_only=True)
    payload["state_dict"]["model.extra.weight"] = torch.zeros(2)
    torch.save(payload, b)
    with pytest.raises(CheckpointError, match=r"step=00000002\.ckpt.*extra\.weight"):
        ck.average_checkpoints([a, b])
    payload["state_dict"].pop("model.extra.weight")
    payload["state_dict"]["model.src_embed.weight"] = torch.zeros(3, 16)
    torch.save(payload, b)
    with pytest.raises(CheckpointError, match=r"step=00000002\.ckpt.*src_embed\.weight.*shape"):
        ck.average_checkpoints([a, b])


def test_corrupt_or_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    good = tmp_path / "step=00000001.ckpt"
    lightning_like_checkpoint(good, 1, seed=1)
    truncated = tmp_path / "step=00000002.ckpt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"step=00000002\.ckpt: cannot be read"):
        ck.average_checkpoints([good, truncated])
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="foreign.pt: neither a Lightning checkpoint"):
        ck.load_model_file(foreign)
    with pytest.raises(CheckpointError, match="missing.pt: checkpoint file not found"):
        ck.load_checkpoint(tmp_path / "missing.pt")
    # A pickled object (not plain weights) is refused by weights_only loading.
    pickled = tmp_path / "pickled.pt"
    torch.save({"state_dict": Path("x")}, pickled)
    with pytest.raises(CheckpointError, match="pickled.pt: cannot be read"):
        ck.load_checkpoint(pickled)
    other = tmp_path / "other.pt"
    torch.save({"format": "something/9", "state_dict": {}}, other)
    with pytest.raises(CheckpointError, match="unknown model file format"):
        ck.load_model_file(other)


def test_model_file_round_trip_loads_weights_only(tmp_path: Path) -> None:
    src = tmp_path / "step=00000007.ckpt"
    state = lightning_like_checkpoint(src, 7, seed=7)
    out = tmp_path / "averaged.pt"
    ck.save_model_file(
        out,
        model_config=CFG.to_dict(),
        state_dict=state,
        vocab=VOCAB,
        step=7,
        source_checkpoints=[src.name],
    )
    raw = torch.load(out, weights_only=True)
    assert raw["format"] == ck.MODEL_FILE_FORMAT
    assert raw["source_checkpoints"] == ["step=00000007.ckpt"] and raw["step"] == 7
    model, meta = ck.load_model_file(out)
    assert not model.training
    assert meta["vocab"] == VOCAB and meta["step"] == 7
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
    # Wrong weights for the recorded config: a clear error, not a half-loaded model.
    raw["state_dict"]["src_embed.weight"] = torch.zeros(41, 16)
    torch.save(raw, out)
    with pytest.raises(CheckpointError, match="weights do not fit the model config"):
        ck.load_model_file(out)


def test_average_cli_last_k_and_inputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    states = {
        s: lightning_like_checkpoint(ckpt_dir / ck.checkpoint_name(s), s, seed=s)
        for s in (10, 20, 30, 40)
    }
    out = tmp_path / "averaged.pt"
    stale = tmp_path / "average_selection.json"  # left by an earlier `--last auto`
    stale.write_text('{"best_k": 20}')
    argv = ["average", "--checkpoint-dir", str(ckpt_dir), "--last", "2", "--out", str(out)]
    assert main(argv) == 0
    assert not stale.exists()  # it described another model
    model, meta = ck.load_model_file(out)
    assert meta["step"] == 40
    assert meta["source_checkpoints"] == ["step=00000030.ckpt", "step=00000040.ckpt"]
    key = "src_embed.weight"
    torch.testing.assert_close(
        model.state_dict()[key], (states[30][key] + states[40][key]) / 2, rtol=0, atol=1e-6
    )

    explicit = tmp_path / "explicit.pt"
    inputs = [str(ckpt_dir / ck.checkpoint_name(s)) for s in (10, 40)]
    assert main(["average", "--inputs", *inputs, "--out", str(explicit)]) == 0
    _, meta = ck.load_model_file(explicit)
    assert meta["source_checkpoints"] == ["step=00000010.ckpt", "step=00000040.ckpt"]

    # Fewer checkpoints than K: a clear error and no output.
    missing_out = tmp_path / "none.pt"
    argv = ["average", "--checkpoint-dir", str(ckpt_dir), "--last", "5", "--out", str(missing_out)]
    assert main(argv) == 2
    assert "only 4 checkpoints" in capsys.readouterr().err
    assert not missing_out.exists()


def test_average_cli_refuses_checkpoints_of_different_experiments(tmp_path: Path) -> None:
    a, b = tmp_path / "step=00000001.ckpt", tmp_path / "step=00000002.ckpt"
    lightning_like_checkpoint(a, 1, seed=1)
    lightning_like_checkpoint(b, 2, seed=2)
    payload = torch.load(b, weights_only=True)
    payload["hyper_parameters"]["vocab"]["sha256"] = "cd" * 32
    torch.save(payload, b)
    out = tmp_path / "avg.pt"
    assert main(["average", "--inputs", str(a), str(b), "--out", str(out)]) == 2
    assert not out.exists()


def test_experiment_mismatch_is_one_rule_for_config_and_vocabulary() -> None:
    meta = {"model_config": CFG.to_dict(), "vocab": dict(VOCAB)}
    same = ck.experiment_mismatch(meta, model_config=CFG.to_dict(), vocab_sha256=VOCAB["sha256"])
    assert same is None
    other_cfg = {**CFG.to_dict(), "d_ff": 64, "p_drop": 0.3}
    assert ck.experiment_mismatch(meta, model_config=other_cfg, vocab_sha256=VOCAB["sha256"]) == (
        "another model config (differs in ['d_ff', 'p_drop'])"
    )
    other_vocab = ck.experiment_mismatch(meta, model_config=None, vocab_sha256="cd" * 32)
    assert other_vocab == f"another vocabulary (sha256 {'ab' * 32}, expected {'cd' * 32})"
    # a model config of None checks the vocabulary only (the translator's case)
    assert ck.experiment_mismatch(meta, model_config=None, vocab_sha256=VOCAB["sha256"]) is None


def test_a_checkpoint_from_before_the_release_is_refused_in_one_line(tmp_path: Path) -> None:
    """Separate W^Q, W^K, W^V (the layout before release 0.1.0): a one-line error naming the
    file, retraining and the last commit that read it; loading, averaging and resuming refuse."""
    from transformer_nmt.training.config import TrainConfig
    from transformer_nmt.training.resume import start_point

    path = tmp_path / ck.checkpoint_name(1)
    state = lightning_like_checkpoint(path, 1, seed=1)
    payload = torch.load(path, weights_only=True)
    w_qkv = state["encoder_layers.0.self_attn.w_qkv.weight"]
    del payload["state_dict"]["model.encoder_layers.0.self_attn.w_qkv.weight"]
    for part, chunk in zip(("w_q", "w_k", "w_v"), w_qkv.chunk(3), strict=True):
        payload["state_dict"][f"model.encoder_layers.0.self_attn.{part}.weight"] = chunk.clone()
    torch.save(payload, path)

    def resume(p: Path) -> object:
        return start_point(
            p.parent, model_config=CFG.to_dict(), vocab_sha256=VOCAB["sha256"],
            train_cfg=TrainConfig(),
        )  # fmt: skip

    for load in (ck.load_model_file, lambda p: ck.average_checkpoints([p]), resume):
        with pytest.raises(CheckpointError) as err:
            load(path)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{path}: written before release")
        assert "retrain" in message and ck.PRE_RELEASE_READER in message
        assert "newest checkpoint" not in message  # resuming from an older one is no way out


def _full_checkpoint(path: Path, step: int, seed: int) -> dict:
    """``lightning_like_checkpoint`` with a training state: Adam's two moments per weight."""
    weights = lightning_like_checkpoint(path, step, seed)
    payload = torch.load(path, weights_only=True)
    state = {i: {"step": torch.tensor(float(step)), "exp_avg": v.clone(), "exp_avg_sq": v.square()}
             for i, v in enumerate(weights.values())}  # fmt: skip
    payload |= {
        "optimizer_states": [{"state": state, "param_groups": [{"lr": 1e-3}]}],
        "lr_schedulers": [{"last_epoch": step}],
        "loops": {"fit_loop": {"epoch_progress": {}}},
        "callbacks": {"StepCheckpoint": {}},
        ck.LEARNING_KEY: {"fingerprint": "f"},
    }
    torch.save(payload, path)
    return payload


def test_a_resume_from_a_checkpoint_without_its_learning_record_is_refused(tmp_path: Path) -> None:
    """No ``LEARNING_KEY`` (written before release 0.1.0): a one-line error, no guessed resume."""
    from transformer_nmt.training.config import TrainConfig
    from transformer_nmt.training.resume import start_point

    path = tmp_path / ck.checkpoint_name(1)
    _full_checkpoint(path, 1, seed=1)
    payload = torch.load(path, weights_only=True)
    del payload[ck.LEARNING_KEY]
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as err:
        start_point(
            tmp_path, model_config=CFG.to_dict(), vocab_sha256=VOCAB["sha256"],
            train_cfg=TrainConfig(),
        )  # fmt: skip
    assert str(err.value).startswith(f"{path}: written before release")
    assert "\n" not in str(err.value) and ck.PRE_RELEASE_READER in str(err.value)


def test_a_demoted_checkpoint_keeps_the_weights_and_what_averaging_reads(tmp_path: Path) -> None:
    full = _full_checkpoint(tmp_path / "full.ckpt", 5, seed=1)
    demoted = tmp_path / ck.checkpoint_name(5)
    demoted.write_bytes((tmp_path / "full.ckpt").read_bytes())
    assert ck.demote_to_weights_only(demoted) is True
    payload = ck.load_checkpoint(demoted)
    assert ck.is_weights_only(payload) and not ck.is_weights_only(full)
    kept = {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "hparams_name",
            "hyper_parameters", ck.LEARNING_KEY}  # fmt: skip
    assert set(payload) == (kept & set(full)) | {ck.WEIGHTS_ONLY_KEY}
    assert payload["state_dict"].keys() == full["state_dict"].keys()
    assert all(torch.equal(payload["state_dict"][k], v) for k, v in full["state_dict"].items())
    assert payload[ck.LEARNING_KEY] == full[ck.LEARNING_KEY]
    # a third of the disk: the weights without Adam's two moments
    assert demoted.stat().st_size < 0.4 * (tmp_path / "full.ckpt").stat().st_size
    # averaging reads the same weights from either: a bit-identical average
    for a, b in zip(
        ck.average_checkpoints([tmp_path / "full.ckpt"] * 2).values(),
        ck.average_checkpoints([demoted] * 2).values(),
        strict=True,
    ):
        assert torch.equal(a, b)
    # a second demotion writes nothing
    mtime = demoted.stat().st_mtime_ns
    assert ck.demote_to_weights_only(demoted) is False
    assert demoted.stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    "failure", [OSError(28, "No space left on device"), KeyboardInterrupt("killed")]
)
def test_a_demotion_cut_short_leaves_the_full_checkpoint(tmp_path, monkeypatch, failure) -> None:
    """A full disk or a kill while the weights-only file is written: the full checkpoint stays
    as it was, and no temporary file is left beside it."""
    path = tmp_path / ck.checkpoint_name(5)
    _full_checkpoint(path, 5, seed=1)
    before = path.read_bytes()

    def save_half(obj, f) -> None:
        Path(f).write_bytes(b"PK\x03\x04 half a file")
        raise failure

    monkeypatch.setattr(ck.torch, "save", save_half)
    with pytest.raises(type(failure)):
        ck.demote_to_weights_only(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
