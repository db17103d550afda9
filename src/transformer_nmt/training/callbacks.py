"""Lightning callbacks and logger of a training run: step-named checkpoints (§6.1), per-step
reseeding (resume-exact dropout), log lines for Snakemake log files, MLflow logging."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from transformer_nmt.io_utils import write_json
from transformer_nmt.runs.checkpoints import LIGHTNING_FILENAME, checkpoint_name
from transformer_nmt.runs.layout import LAST_VALIDATION_FILE
from transformer_nmt.training.config import TrainConfig

if TYPE_CHECKING:
    from transformer_nmt.tracking import StageRun

log = logging.getLogger(__name__)


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` keeping the newest ``keep`` files ``step=00001000.ckpt`` (monitor =
    step, mode max), every N steps or T minutes, plus one at ``max_steps``; never on exception
    (a NaN loss must not leave a checkpoint with NaN weights behind)."""

    def __init__(self, dirpath: Path, cfg: TrainConfig) -> None:
        every_steps = cfg.checkpoint_every_steps
        super().__init__(
            dirpath=dirpath,
            filename=LIGHTNING_FILENAME,  # checkpoints.checkpoint_name
            auto_insert_metric_name=False,
            monitor="step",
            mode="max",
            save_top_k=cfg.keep_checkpoints,
            every_n_train_steps=every_steps,
            train_time_interval=(
                None if every_steps else timedelta(minutes=cfg.checkpoint_every_minutes)
            ),
            save_on_train_epoch_end=True,  # no epoch-end saves (every_n_epochs is 0) nor deferrals
            save_on_exception=False,
            enable_version_counter=False,
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step >= trainer.max_steps and not self._should_skip_saving_checkpoint(
            trainer
        ):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))


class TrainingStopped(Exception):
    """Raised by ``StopOnSignal`` to end ``fit`` after a SIGINT/SIGTERM (mapped to a clear
    error by ``training.run``)."""

    def __init__(self, signal_name: str, step: int, saved: bool) -> None:
        super().__init__(f"stopped by {signal_name} at step {step}")
        self.signal_name, self.step, self.saved = signal_name, step, saved


class StopOnSignal(Callback):
    """SIGTERM (what SLURM and Snakemake send), SIGUSR1 (what SLURM sends before a time limit
    with ``--signal=USR1@<s>``, profiles/slurm) and SIGINT (Ctrl-C) stop training at the end of
    the current update, where the state is whole: the run saves one checkpoint there, then
    ``fit`` ends with ``TrainingStopped`` (the job exits non-zero, Snakemake's retry resubmits
    it and it resumes from that checkpoint).

    Every rank takes the signals over (Lightning's own SIGTERM handler, which kills the other
    ranks, is replaced). In DDP the ranks agree at each update's end whether any of them got a
    signal (one all-reduce of a flag per update), so all of them stop at the same update and
    save one checkpoint together. A second signal to a rank stops it at once.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, checkpoint: StepCheckpoint) -> None:
        self.checkpoint = checkpoint
        self._received: str | None = None
        self._previous_handlers: dict[int, Any] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self._previous_step = trainer.global_step
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._received is not None:  # a second signal: stop now
            raise KeyboardInterrupt(f"second {name}")
        self._received = name
        log.warning("%s: stopping at the end of this update (send it again to stop now)", name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        stepped, self._previous_step = step != self._previous_step, step
        if not stepped or step >= trainer.max_steps:
            return  # mid-accumulation (wait for the update's end), or done anyway
        name = self._received or ("SIGTERM" if trainer.received_sigterm else None)
        if trainer.world_size > 1:  # every rank stops if any rank got a signal
            if not trainer.strategy.reduce_boolean_decision(name is not None, all=False):
                return
            name = name or "a signal to another rank"
        elif name is None:
            return
        # the periodic checkpoint of this step may already be written (rank 0 decides for all)
        saved = (Path(self.checkpoint.dirpath) / checkpoint_name(step)).is_file()
        saved = trainer.strategy.broadcast(saved, src=0)
        if not saved:  # every rank calls the save; rank 0 writes the file
            candidates = self.checkpoint._monitor_candidates(trainer)
            self.checkpoint._save_topk_checkpoint(trainer, candidates)
            saved = True
        raise TrainingStopped(name, step, saved)

    def _restore(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()


class StepSeed(Callback):
    """Reseeds the RNGs before every micro-batch from (seed, rank, step, batch index).

    Dropout masks are then a function of the training position alone, so a resumed run draws
    the same masks as an uninterrupted one, and ranks draw different ones.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        key = [self.seed, trainer.global_rank, trainer.global_step, batch_idx]
        torch.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))


class Throughput(Callback):
    """Source/target tokens per second (non-padding) over the last ``every`` updates, for all
    devices (the local rate times the world size: batches are balanced by max_tokens). Runs
    before ``LogLines`` so that the line of step k shows the window ending at step k."""

    def __init__(self, every: int, pad_id: int = 0) -> None:
        self.every, self.pad_id = every, pad_id
        self.total_tokens = {"src": 0, "tgt": 0}
        self.total_seconds = 0.0
        self.last_rate = float("nan")

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._previous_step = trainer.global_step
        self._window: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Counted on the device, read back only at logging steps (no sync per batch).
        counts = torch.stack(
            [(batch["src"] != self.pad_id).sum(), (batch["tgt_out"] != self.pad_id).sum()]
        )
        self._window = counts if self._window is None else self._window + counts
        step = trainer.global_step
        stepped, self._previous_step = step != self._previous_step, step
        if not stepped or (step % self.every and step != trainer.max_steps):
            return
        now = time.perf_counter()
        seconds = max(now - self._start, 1e-9)
        src, tgt = (int(v) * trainer.world_size for v in self._window.tolist())
        self.total_tokens["src"] += src
        self.total_tokens["tgt"] += tgt
        self.total_seconds += seconds
        self.last_rate = tgt / seconds
        pl_module.log("train/tgt_tokens_per_s", tgt / seconds, on_step=True)
        pl_module.log("train/src_tokens_per_s", src / seconds, on_step=True)
        self._start, self._window = now, None

    def mean_tgt_tokens_per_s(self) -> float:
        return self.total_tokens["tgt"] / max(self.total_seconds, 1e-9)


class _LossWindow:
    """The training loss averaged over the optimizer updates since it was last taken; fed at
    every batch end, it counts each update once (the micro-batches of an accumulation end
    no update)."""

    def __init__(self, step: int) -> None:
        self._previous_step = step
        self._sum, self._count = 0.0, 0

    def update(self, trainer) -> bool:
        """Add this update's loss; False when the batch ended no update."""
        step = trainer.global_step
        stepped, self._previous_step = step != self._previous_step, step
        if stepped and "train/loss" in trainer.callback_metrics:
            # a host float: logged from a host value
            self._sum += float(trainer.callback_metrics["train/loss"])
            self._count += 1
        return stepped

    def take(self) -> float | None:
        """The mean since the last take (None without losses), and start a new window."""
        mean = self._sum / self._count if self._count else None
        self._sum, self._count = 0.0, 0
        return mean


def _due(step: int, every: int, max_steps: int) -> bool:
    """A report every ``every`` updates and at the last one."""
    return step % every == 0 or step == max_steps


def measured_validation(trainer, pl_module) -> dict[str, float]:
    """The values this validation measured: loss, perplexity and the BLEUs it computed (a BLEU
    kept in ``callback_metrics`` from an earlier validation is stale, not measured now)."""
    m = trainer.callback_metrics
    return {
        key: float(m[key])
        for key in ("val/loss", "val/ppl", "val/bleu", "val/bleu_beam")
        if key in m and (not key.startswith("val/bleu") or key in pl_module.measured_now)
    }


class LogLines(Callback):
    """One log line per ``log_every_steps`` updates, readable in a Snakemake log file (where a
    tqdm bar is not): step and percent of ``max_steps``, elapsed time and ETA, the training
    loss averaged over the updates since the last line, lr, gradient norm and tokens/s; and
    one line per validation, with the values it measured."""

    def __init__(self, every: int, max_steps: int) -> None:
        self.every, self.max_steps = every, max_steps

    def on_train_start(self, trainer, pl_module) -> None:
        self._start_step = trainer.global_step
        self._window = _LossWindow(trainer.global_step)
        self._started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not self._window.update(trainer) or not _due(step, self.every, self.max_steps):
            return
        m = trainer.callback_metrics
        elapsed = time.monotonic() - self._started
        done = step - self._start_step
        eta = elapsed / done * (self.max_steps - step) if done else float("nan")
        parts = [
            f"step {step}/{self.max_steps} ({100 * step / self.max_steps:.0f}%)",
            f"elapsed {_clock(elapsed)}",
            f"eta {_clock(eta)}",
        ]
        loss = self._window.take()
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        for key, fmt in (
            ("train/lr", "lr {:.3e}"),
            ("train/grad_norm", "grad_norm {:.3f}"),
            ("train/tgt_tokens_per_s", "tgt tok/s {:.0f}"),
        ):
            if key in m:
                parts.append(fmt.format(float(m[key])))
        if trainer.is_global_zero:
            log.info("  ".join(parts))

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        measured = measured_validation(trainer, pl_module)
        parts = []
        for key, fmt in (
            ("val/loss", "loss {:.4f}"),
            ("val/ppl", "ppl {:.2f}"),
            ("val/bleu", "greedy bleu {:.2f}"),
            ("val/bleu_beam", "beam bleu {:.2f}"),
        ):
            if key in measured:
                parts.append(fmt.format(measured[key]))
        log.info("validation at step %d: %s", trainer.global_step, "  ".join(parts))


def _clock(seconds: float) -> str:
    """``1h02m03s`` / ``2m03s`` / ``?`` for an unknown duration."""
    if seconds != seconds or seconds == float("inf"):  # NaN or unbounded
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class LastValidation(Callback):
    """Keeps the newest validation's metrics in ``<checkpoints>/last_validation.json``: Lightning
    saves a step's checkpoint before that step's validation, so a job resumed after it (a kill,
    a raised ``max_steps``) would otherwise report no validation at all."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.path = Path(checkpoint_dir) / LAST_VALIDATION_FILE

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        write_json(self.path, {"step": trainer.global_step, "metrics": metrics})


def read_last_validation(checkpoint_dir: Path) -> dict[str, Any]:
    """What ``LastValidation`` kept ({} when nothing was validated yet)."""
    try:
        record = json.loads((Path(checkpoint_dir) / LAST_VALIDATION_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class MetricsHistory(Callback):
    """Appends the run's learning curve to ``<run-dir>/metrics.csv`` (``metrics_history``): a
    training row every ``every`` updates (loss averaged over them, lr) and a row per validation
    (loss, perplexity, the BLEUs it measured), with the update count and the wall-clock seconds
    of training. The file survives resumes: a resumed job first drops the rows beyond its
    starting step (atomic rewrite; re-done steps would otherwise appear twice) and its clock
    continues from the last row kept. Rank 0 writes it."""

    def __init__(self, path: Path, every: int, max_steps: int) -> None:
        self.path, self.every, self.max_steps = Path(path), every, max_steps

    def on_train_start(self, trainer, pl_module) -> None:
        from transformer_nmt.runs import metrics_history as mh

        start = trainer.global_step
        self._window = _LossWindow(start)
        self._offset = 0.0
        self._started = time.monotonic()
        if not trainer.is_global_zero:
            return
        kept: list[mh.MetricsRow] = []
        if start > 0 and self.path.is_file():
            rows = mh.read_metrics(self.path, drop_partial_last=True)
            kept = [r for r in rows if r.step <= start]
            if len(kept) < len(rows):
                log.info(
                    "%s: dropped %d row(s) beyond step %d (resumed there)",
                    self.path, len(rows) - len(kept), start,
                )  # fmt: skip
            self._offset = kept[-1].elapsed_s if kept else 0.0
        # from scratch (also after a start over): a fresh file; on resume the rows kept
        mh.write_metrics(self.path, kept)

    def _append(self, trainer, values: dict[str, float]) -> None:
        from transformer_nmt.runs import metrics_history as mh

        elapsed = self._offset + time.monotonic() - self._started
        mh.append_metrics(self.path, mh.row(trainer.global_step, elapsed, values))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not self._window.update(trainer) or not _due(step, self.every, self.max_steps):
            return
        loss = self._window.take()
        if loss is None:
            return
        values = {"train_loss": loss}
        m = trainer.callback_metrics
        if "train/lr" in m:
            values["lr"] = float(m["train/lr"])
        if trainer.is_global_zero:
            self._append(trainer, values)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        measured = measured_validation(trainer, pl_module)
        values = {key.replace("/", "_"): value for key, value in measured.items()}
        if values:
            self._append(trainer, values)


class StageRunLogger(Logger):
    """Lightning logger that writes metrics into the experiment's MLflow run through
    ``tracking.StageRun`` (batched, retried on a locked store). Params are logged by the CLI.

    * **One point per step.** MLflow keeps every point logged, two for a step logged twice
      (and has no call to delete one). Steps that a killed attempt logged after its last
      checkpoint are trained again after the resume, so a point whose (key, step) the run
      already has is not logged again: the first attempt's point stands, for the same update
      (same checkpoint, data position and ``StepSeed`` dropout).
    * **A failing store does not stop training.** The first failed call (full disk, a store
      locked past ``tracking.with_retry``'s budget, an unreachable server) is one warning
      (``tracking.notice``: the log and the Snakemake terminal); later calls are tried once,
      without the lock retries, until one succeeds, and the points of failed calls are counted
      in ``points_lost`` (``train_summary.json``'s ``mlflow_points_lost``).
    """

    def __init__(self, run: StageRun) -> None:
        super().__init__()
        self._run = run
        self._logged: dict[str, set[int]] = {}  # steps the run had for each key
        self.points_lost = 0
        self.first_error: str | None = None
        self._failing = False

    @property
    def name(self) -> str:
        return "mlflow"

    @property
    def version(self) -> str:
        return self._run.run_id

    @property
    @rank_zero_experiment
    def experiment(self) -> StageRun:
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Params go in through ``tracking.stage_run`` (prefixed by the stage)."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items() if k != "epoch"}
        # Lightning passes the number of updates done *before* the current one (0-based,
        # also for validation inside it); MLflow gets the update count after it, so that
        # the loss of update k and the validation after it are logged at step k.
        mlflow_step = 0 if step is None else step + 1
        if not values:
            return
        try:
            for key in values.keys() - self._logged.keys():
                self._logged[key] = self._run.logged_steps(key, retry=not self._failing)
            values = {k: v for k, v in values.items() if mlflow_step not in self._logged[k]}
            if values:
                self._run.log_metrics(values, step=mlflow_step, retry=not self._failing)
        except Exception as err:  # a tracking outage must not kill a training run
            from transformer_nmt.tracking import first_line, notice

            self.points_lost += len(values)
            if self.first_error is None:
                self.first_error = first_line(err)
                notice(
                    f"MLflow: could not log {len(values)} metric point(s) of run "
                    f"{self._run.run_name!r} at step {mlflow_step} ({self.first_error}); "
                    "training goes on, and train_summary.json counts the points lost "
                    "(mlflow_points_lost)"
                )
            self._failing = True
            return
        self._failing = False


class BatchTrace(Callback):
    """Debug/test aid: appends each training batch's example indices, with rank, epoch and
    step, to ``<directory>/rank<R>.jsonl`` (enabled by the train CLI's trace variable)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import json

        self.directory.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": trainer.global_rank,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "batch_idx": batch_idx,
            "index": batch["index"].tolist(),
        }
        with open(self.directory / f"rank{trainer.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
