"""What a run reports as it goes: throughput, one log line per N updates for Snakemake's log
files, and ``metrics.csv`` (the learning curve), all from one loss window per optimizer update."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


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


class MetricsHistory(Callback):
    """Appends the run's learning curve to ``<run-dir>/metrics.csv`` (``metrics_history``): a
    training row every ``every`` updates (loss averaged over them, lr) and a row per validation
    (loss, perplexity, the BLEUs it measured), with the update count and the wall-clock seconds
    of training. The file survives resumes: a resumed job first drops the rows beyond its
    starting step (atomic rewrite; re-done steps would otherwise appear twice) and its clock
    continues from the last row kept. Rank 0 writes it.

    The same clock goes to the run's loggers (MLflow) as ``val/train_minutes`` at every
    validation, at the validation's step: in the MLflow UI a chart of ``val/bleu_beam`` with
    that metric as its x-axis is dev BLEU against minutes of training (relative wall time would
    count the pauses between the jobs of a resumed run)."""

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

    def _append(self, trainer, values: dict[str, float]) -> float:
        """Append a row; return its elapsed training seconds."""
        from transformer_nmt.runs import metrics_history as mh

        elapsed = self._offset + time.monotonic() - self._started
        mh.append_metrics(self.path, mh.row(trainer.global_step, elapsed, values))
        return elapsed

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
            minutes = {"val/train_minutes": self._append(trainer, values) / 60}
            for logger in trainer.loggers:
                # Lightning's convention: the step before the update count (StageRunLogger)
                logger.log_metrics(minutes, step=trainer.global_step - 1)
