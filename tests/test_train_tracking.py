"""MLflow tracking of a training run, and its logger through a tracking outage."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.training_helpers import VOCAB, train_argv
from transformer_nmt.cli import main


def test_mlflow_tracking_of_a_training_run(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_store: str,
) -> None:
    import shutil

    from mlflow.tracking import MlflowClient

    from transformer_nmt.io_utils import sha256_file

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # The data stages' records beside their outputs: spm.json and clean_report.json.
    spm_model = tmp_path / "spm" / "spm.model"
    spm_model.parent.mkdir()
    shutil.copy(corpus["spm"], spm_model)
    spm_settings = {"vocab_size": VOCAB, "seed": 1, "input_lines": {"train.en": 3}, "sha256": "x"}
    (tmp_path / "spm" / "spm.json").write_text(json.dumps(spm_settings))
    report = tmp_path / "clean_report.json"
    rules = {"max_length": 250, "dedupe": True, "max_sentences": None}
    report.write_text(json.dumps({"dataset": "toy", "pair": "en-de", "rules": rules}))
    argv = train_argv({**corpus, "spm": spm_model}, tmp_path / "run", max_steps=10)
    argv += ["--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]
    argv += ["--clean-report", str(report)]
    assert main(argv) == 0
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("toy_en-de")
    (run,) = client.search_runs([exp.experiment_id])
    params = run.data.params
    assert params["train.max_steps"] == "10" and params["train.model.d_model"] == "32"
    assert (
        run.data.tags["data.spm_sha256"]
        == json.loads((tmp_path / "run" / "train_summary.json").read_text())["vocab"]["sha256"]
    )
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == [5, 10]
    assert all(math.isfinite(m.value) for m in losses)
    assert client.get_metric_history(run.info.run_id, "val/loss")
    assert client.get_metric_history(run.info.run_id, "train/lr")
    assert client.get_metric_history(run.info.run_id, "train/grad_norm")
    rates = client.get_metric_history(run.info.run_id, "train/tgt_tokens_per_s")
    assert sorted(m.step for m in rates) == [5, 10] and all(m.value > 0 for m in rates)
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"data", "train_summary.json"} <= artifacts
    assert run.info.status == "FINISHED" and run.info.end_time >= run.info.start_time
    # The data stages' settings as data.* params, the data's checksums as tags.
    data_params = {k: v for k, v in params.items() if k.startswith("data.")}
    assert data_params == {
        "data.vocab_size": str(VOCAB), "data.spm.vocab_size": str(VOCAB), "data.spm.seed": "1",
        "data.dataset": "toy", "data.pair": "en-de", "data.clean.max_length": "250",
        "data.clean.dedupe": "True", "data.clean.max_sentences": "null",
    }  # fmt: skip
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            for kind in ("tokens", "offsets"):
                path = corpus["bin"] / f"{split}.{lang}.{kind}.npy"
                assert run.data.tags[f"data.{split}.{lang}.{kind}_sha256"] == sha256_file(path)

    # Retraining from scratch with unchanged params (a forced re-run) opens a fresh run whose
    # description says why; the old run points to it.
    (tmp_path / "run" / "train_summary.json").unlink()
    assert main(argv) == 0
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    assert len(runs) == 2
    newest, old = runs
    assert old.data.tags["transformer_nmt.superseded_by"] == newest.info.run_id
    assert "forced re-run" in newest.data.tags["mlflow.note.content"]
    assert newest.data.params["data.vocab_size"] == str(VOCAB)  # logged anew, not copied


def test_mlflow_logger_shifts_steps_and_survives_a_tracking_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from transformer_nmt.training.callbacks import StageRunLogger

    class FakeRun:
        run_id, run_name = "r1", "tiny"

        def __init__(self) -> None:
            self.logged: list[tuple[dict, int | None]] = []
            self.down = False

        def logged_steps(self, key: str, *, retry: bool = True) -> set[int]:
            return set()

        def log_metrics(self, metrics: dict, step: int | None = None, *, retry=True) -> None:
            if self.down:
                raise ConnectionError("tracking server unreachable")
            self.logged.append((metrics, step))

    run = FakeRun()
    logger = StageRunLogger(run)
    logger.log_metrics({"train/loss": torch.tensor(2.5), "epoch": 0.0}, step=4)
    assert run.logged == [({"train/loss": 2.5}, 5)]
    run.down = True
    with caplog.at_level(logging.WARNING):
        logger.log_metrics({"train/loss": 2.0}, step=9)
    assert "could not log 1 metric point(s) of run 'tiny' at step 10" in caplog.text
