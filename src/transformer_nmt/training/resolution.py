"""A run's "auto" settings on this machine, resolved once into one ``Resolved`` record by the
rules of ``training.rules`` (``resolve``; the train stage's ``resolve_run`` also sizes
``max_tokens: auto`` with the planner), and Lightning's strategy for it (``strategy_for``). The
pre-flight check, the trainer, the logs, the run summary and MLflow read that record.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from transformer_nmt.data.vocab import VocabInfo
from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.training.cluster import local_rank
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.hardware import GIB, this_device, total_ram_bytes
from transformer_nmt.training.memory import AUTO_MARGIN, AUTO_STEP
from transformer_nmt.training.preflight import refusal, size_max_tokens
from transformer_nmt.training.rules import (
    accumulation_steps,
    pad_multiple_choice,
    precision_choice,
    resolve_accelerator,
    resolve_devices,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """A run's hardware-dependent settings, resolved once at its start (``resolve``; the
    train stage's ``resolve_run`` also sizes ``max_tokens: auto``). The pre-flight
    check, the data module, the trainer, the logs, the run summary and MLflow all read this
    record; nothing after it resolves an "auto" value again."""

    accelerator: str
    devices: int  # processes per node
    num_nodes: int
    precision: str  # a Lightning precision string
    precision_why: str
    pad_multiple: int  # batch widths are rounded up to a multiple of this
    pad_multiple_why: str
    max_tokens: int | str  # tokens per micro-batch; "auto" until sized
    strategy: str  # as configured; "auto" is DDP when several processes train (``strategy_for``)
    accumulation: int | None = None  # micro-batches per update, once the data is known

    @property
    def world_size(self) -> int:
        """Processes in all."""
        return self.devices * self.num_nodes

    def with_accumulation(
        self, tokens_per_update: int, tgt_tokens_per_batch: float | None = None
    ) -> Resolved:
        """This record with its §5.1 accumulation (``rules.accumulation_steps``) over the data's
        average real target tokens per batch (without data: ``max_tokens``)."""
        steps = accumulation_steps(
            tokens_per_update, self.max_tokens, self.world_size, tgt_tokens_per_batch
        )
        return dataclasses.replace(self, accumulation=steps)

    def applied_to(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with its micro-batch size as resolved (the key a resume compares)."""
        return dataclasses.replace(cfg, max_tokens=self.max_tokens)

    def chosen(self) -> dict[str, str]:
        """The choices and their reasons, as the train log and MLflow's tags give them."""
        return {
            "precision_chosen": f"{self.precision} ({self.precision_why})",
            "pad_multiple_chosen": f"{self.pad_multiple} ({self.pad_multiple_why})",
            "micro_batch_tokens": str(self.max_tokens),
        }


def resolve(cfg: TrainConfig) -> Resolved:
    """The "auto" values of ``cfg`` on this machine, ``max_tokens`` as configured."""
    precision, precision_why = precision_choice(cfg)
    pad_multiple, pad_multiple_why = pad_multiple_choice(cfg)
    return Resolved(
        accelerator=resolve_accelerator(cfg),
        devices=resolve_devices(cfg),
        num_nodes=cfg.num_nodes,
        precision=precision,
        precision_why=precision_why,
        pad_multiple=pad_multiple,
        pad_multiple_why=pad_multiple_why,
        max_tokens=cfg.max_tokens,
        strategy=cfg.strategy,
    )


def strategy_for(resolved: Resolved) -> Any:
    """Lightning's strategy: as configured, or for "auto" DDP (gloo on CPU, NCCL on GPU) when
    several processes train, else Lightning's own."""
    if resolved.strategy != "auto":
        return resolved.strategy
    if resolved.world_size > 1:
        from lightning.pytorch.strategies import DDPStrategy

        backend = "gloo" if resolved.accelerator == "cpu" else None
        return DDPStrategy(process_group_backend=backend)
    return "auto"


def resolve_run(model_cfg: ModelConfig, train_cfg: TrainConfig, vocab: VocabInfo) -> Resolved:
    """The run's hardware-dependent settings, once, at its start (``resolve``), with
    ``max_tokens: auto`` sized to this process's device (``preflight.size_max_tokens``: the same
    size on every rank) and every choice logged with its reason. The pre-flight
    check (``training.run.plan_start``) then measures the sized batch on a GPU."""
    resolved = resolve(train_cfg)
    if train_cfg.max_tokens == "auto":
        _, target = this_device(
            resolved.accelerator, local_rank(), resolved.devices, cpu_ram=total_ram_bytes()
        )
        plan = size_max_tokens(model_cfg, train_cfg, vocab.size, resolved.precision, target)
        if not plan.fits:
            raise ConfigError(refusal(plan, "train.max_tokens", model_cfg, train_cfg, vocab.size))
        share = -(-plan.tokens_per_update // plan.world_size)
        limit = "its share of an update" if plan.max_tokens > share - AUTO_STEP else "the memory"
        detail = (
            f"the worst-case batch {plan.batch} x {plan.width} ({plan.precision}) is estimated "
            f"at {plan.peak_bytes / GIB:.2f} GiB, at most {AUTO_MARGIN * 100:.0f}% of "
            f"{(plan.usable_bytes or 0) / GIB:.1f} GiB usable; tokens_per_update="
            f"{plan.tokens_per_update} over {plan.world_size} process(es) is {share} each"
        )
        resolved = dataclasses.replace(resolved, max_tokens=plan.max_tokens)
        log.info(
            "max_tokens: auto -> %d tokens per micro-batch (limited by %s): %s",
            plan.max_tokens, limit, detail,
        )  # fmt: skip
    log.info("precision: %s (%s)", resolved.precision, resolved.precision_why)
    log.info(
        "batch widths rounded up to a multiple of %d (%s)",
        resolved.pad_multiple, resolved.pad_multiple_why,
    )  # fmt: skip
    return resolved
