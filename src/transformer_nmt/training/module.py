"""``TranslationModule``: the LightningModule of §5 around the §3 ``Transformer``.

It owns the label-smoothed loss (§5.4), Adam with the per-update learning-rate schedule (§5.3)
and the logging: smoothed training loss per target token, NLL and perplexity, learning rate,
gradient norm (before clipping), validation loss/perplexity
optional greedy validation BLEU on the first ``val_bleu_sentences`` validation sentences, and
optional §6.1 beam-search BLEU on the whole dev set every ``val_beam_bleu_every_steps``.
Throughput (tokens per second) is measured by ``callbacks.Throughput``.

Its hyper-parameters are plain types (dicts of numbers and strings), so Lightning checkpoints
load with ``torch.load(..., weights_only=True)``. The Transformer is ``self.model``; checkpoint
weights are therefore ``model.*`` (``checkpoints.MODEL_PREFIX``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch

from transformer_nmt.errors import UserFacingError
from transformer_nmt.evaluation.score import bleu_tokenizer
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import LEARNING_KEY
from transformer_nmt.training.config import TrainConfig, learning_fingerprint, learning_settings
from transformer_nmt.training.objective import fused_loss_wanted, loss_path, model_loss
from transformer_nmt.training.optimizer import (
    FUSED_ADAM_DEVICES,
    build_optimizer,
    build_scheduler,
    follow_max_steps,
)

log = logging.getLogger(__name__)


class NonFiniteLossError(UserFacingError):
    """The training loss or gradient norm became NaN/inf: the run stops, keeping the last good
    checkpoint (nothing is saved after the bad value appears)."""


class TranslationModule(L.LightningModule):
    """Trains a ``Transformer`` on batches ``dict(src, tgt_in, tgt_out, index)``."""

    def __init__(
        self,
        model_config: dict[str, Any],
        vocab: dict[str, Any],
        train_config: dict[str, Any],
        spm_model: str | None = None,
        valid_split: str = "valid",
    ) -> None:
        super().__init__()
        # Plain types only: they go into every checkpoint (weights_only loading).
        self.save_hyperparameters()
        self.cfg = ModelConfig.from_dict(dict(model_config))
        self.train_cfg = TrainConfig.from_dict(train_config)
        self.pad_id = int(vocab["pad_id"])
        self.bos_id, self.eos_id = int(vocab["bos_id"]), int(vocab["eos_id"])
        self.model = Transformer(self.cfg, vocab_size=int(vocab["size"]), pad_id=self.pad_id)
        # §5.4 label smoothing eps_ls is part of the model config (Table 3 row D varies it).
        self.eps_ls = self.cfg.eps_ls
        self._check_grad_finite = True
        self.overflow_steps = 0  # updates the loss scaler skipped (fp16) in this job
        self._update_sums: torch.Tensor | None = None  # this update's sums (training_step)
        self.measured_now: set[str] = set()  # metric names of the newest validation

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[LEARNING_KEY] = {
            "fingerprint": learning_fingerprint(
                self.cfg.to_dict(), str(self.hparams.vocab["sha256"]), self.train_cfg
            ),
            "model_config": self.cfg.to_dict(),
            "train": learning_settings(self.train_cfg),
        }

    def on_fit_start(self) -> None:
        # With fp16 mixed precision the GradScaler skips steps with inf gradients by design.
        self._check_grad_finite = self.trainer.precision != "16-mixed"
        setting = self.train_cfg.fused_loss
        fused = fused_loss_wanted(setting, self.device)
        mixed = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}  # autocast's dtype
        path = loss_path(
            self.device, fused=fused, compiled=self.train_cfg.compile,
            autocast=mixed.get(str(self.trainer.precision), False),
            dtype=self.model.projection_weight.dtype,
            chunked=bool(self.train_cfg.loss_chunk_tokens),
        )  # fmt: skip
        described = {
            "chunked": "chunked (train.loss_chunk_tokens)",
            "fused": "fused, torch.compile'd passes over the logits",
            "projected": "projected by chunks of rows, no [tokens x V] logits (CPU fast path "
            "projected_loss)",
            "logits": "eager",
        }
        log.info(
            "loss (§5.4): %s (train.fused_loss: %s%s)",
            described[path],
            setting,
            f" on {self.device.type}" if setting == "auto" else "",
        )  # fmt: skip

    def on_train_start(self) -> None:
        # After a resume (the scheduler's state is restored by now) the cooldown ends at this
        # job's max_steps, which may differ from the checkpoint's.
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            follow_max_steps(scheduler, self.train_cfg.max_steps)

    # --- forward and loss ----------------------------------------------------------------------

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt_in)  # [B, T, V]

    def _forward_model(self) -> torch.nn.Module:
        """``self.model``, or with ``train.compile`` its ``torch.compile`` wrapper (same
        weights; kept out of the module tree so that checkpoints keep their ``model.*`` keys)."""
        if not self.train_cfg.compile:
            return self.model
        compiled = self.__dict__.get("_compiled_model")
        if compiled is None:
            compiled = torch.compile(self.model)
            object.__setattr__(self, "_compiled_model", compiled)  # not a registered submodule
        return compiled

    def _loss(self, batch: dict[str, torch.Tensor]):
        """The batch's summed §5.4 loss."""
        return model_loss(
            self.model, batch, eps=self.eps_ls, pad_id=self.pad_id,
            fused=fused_loss_wanted(self.train_cfg.fused_loss, batch["src"].device),
            forward=self._forward_model() if self.train_cfg.compile else None,
            chunk_tokens=self.train_cfg.loss_chunk_tokens,
        )  # fmt: skip

    # --- training ------------------------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self._loss(batch)
        # Check before backward: a NaN must never reach the weights (or a checkpoint).
        if not bool(torch.isfinite(out.loss)):
            raise NonFiniteLossError(
                f"non-finite training loss ({float(out.loss.detach())}) at step "
                f"{self.global_step + 1} (batch examples {batch['index'][:8].tolist()}...); "
                "stopping without saving. Lower train.lr_scale or set train.clip_grad_norm, "
                "then resume from the last good checkpoint"
            )
        # Sums over this update's micro-batches: smoothed loss, NLL, target and source tokens
        # (real tokens: y EOS and x EOS, no padding).
        src_tokens = (batch["src"] != self.pad_id).sum()
        parts = (out.loss.detach(), out.nll.detach(), out.ntokens, src_tokens)
        sums = torch.stack([part.to(torch.float64) for part in parts])
        self._update_sums = sums if self._update_sums is None else self._update_sums + sums
        # §5.4 summed over the micro-batch's target tokens; normalised per update in
        # on_before_optimizer_step (the number of tokens of the whole update is known there).
        return out.loss

    def _current_lr(self) -> float:
        """The learning rate the coming optimizer update uses (§5.3 schedule)."""
        scheduler = self.lr_schedulers()
        return float(scheduler.get_last_lr()[0]) if scheduler is not None else math.nan

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called once per update, after the last micro-batch's backward (and the DDP all-reduce),
        # before gradient clipping (and after unscaling with AMP).
        sums, self._update_sums = self._update_sums, None
        if sums is None:
            return
        # The update's tokens over all micro-batches and ranks.
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        loss_sum, nll_sum, tgt_tokens, src_tokens = sums.tolist()
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            # One update follows the gradient of the label-smoothed loss summed over *all* its
            # target tokens divided by their number (as tensor2tensor and fairseq do), so a
            # short micro-batch weighs by its tokens, not as much as a long one. Lightning has
            # divided each micro-batch's sum by the accumulation and DDP averaged the ranks:
            # multiply both back and divide by the update's target tokens.
            scale = self.trainer.accumulate_grad_batches * self.trainer.world_size
            torch._foreach_mul_(grads, scale / max(tgt_tokens, 1.0))
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)  # foreach kernels
            finite = bool(torch.isfinite(norm))
            if not finite and self._check_grad_finite:
                raise NonFiniteLossError(
                    f"non-finite gradient norm ({float(norm)}) at step {self.global_step + 1}; "
                    "stopping before the optimizer step. Lower train.lr_scale or set "
                    "train.clip_grad_norm, then resume from the last good checkpoint"
                )
            if not finite:  # fp16: the loss scaler skips this update and lowers its scale
                self.overflow_steps += 1
                log.info(
                    "fp16 overflow at step %d: the loss scaler skips this update (%d so far)",
                    self.global_step + 1, self.overflow_steps,
                )  # fmt: skip
            else:
                self.log("train/grad_norm", norm, on_step=True)
        nll = nll_sum / max(tgt_tokens, 1.0)
        self.log("train/loss", loss_sum / max(tgt_tokens, 1.0), on_step=True, prog_bar=True)
        self.log("train/nll", nll, on_step=True)
        self.log("train/ppl", math.exp(min(nll, 50.0)), on_step=True)
        self.log("train/lr", self._current_lr(), on_step=True, prog_bar=True)
        # §5.1: the paper's batch is ~25k source and ~25k target tokens per update.
        self.log("train/src_tokens_per_update", src_tokens, on_step=True)
        self.log("train/tgt_tokens_per_update", tgt_tokens, on_step=True)

    # --- validation ----------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self._loss(batch)
        self._val_sums += torch.stack([out.loss, out.nll, out.ntokens.to(out.loss)]).double()

    def on_validation_epoch_end(self) -> None:
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        ntokens = float(sums[2].clamp(min=1))
        loss, nll = float(sums[0]) / ntokens, float(sums[1]) / ntokens
        metrics = {"val/loss": loss, "val/nll": nll, "val/ppl": math.exp(min(nll, 50.0))}
        cfg, step = self.train_cfg, self.global_step
        if cfg.val_bleu_sentences > 0:  # cheap: greedy on the first sentences
            limit = cfg.val_bleu_sentences
            metrics["val/bleu"] = self._from_rank_zero(lambda: self._dev_bleu(limit, beam=False))
        every = cfg.val_beam_bleu_every_steps
        if every and (step % every == 0 or step >= cfg.max_steps):
            # the real search (§6.1: beam 4, α = 0.6) on the whole dev set: what the average
            # stage chooses on, as a curve
            metrics["val/bleu_beam"] = self._from_rank_zero(lambda: self._dev_bleu(None, beam=True))
        self.measured_now = set(metrics)  # what this validation measured (log lines)
        for key, value in metrics.items():
            self.log(key, value, on_epoch=True, prog_bar=key == "val/loss", sync_dist=False)

    def _from_rank_zero(self, compute) -> float:
        """A value computed on rank 0 (``compute`` is a zero-argument callable), on every rank."""
        value = compute() if self.trainer.is_global_zero else 0.0
        return float(self.trainer.strategy.broadcast(value, src=0))

    @torch.no_grad()
    def _dev_bleu(self, limit: int | None, *, beam: bool) -> float:
        """Detokenised sacreBLEU of the first ``limit`` dev sentences (None: all), translated
        greedily or with the §6.1 beam search (``search.SearchSettings``)."""
        import sacrebleu
        import sentencepiece as spm

        from transformer_nmt.data.batch import source_batch
        from transformer_nmt.search import SearchSettings, beam_search, greedy_search

        if not self.hparams.spm_model:
            return math.nan
        sp = spm.SentencePieceProcessor(model_file=str(self.hparams.spm_model))
        data = self.trainer.datamodule.dataset(self.hparams.valid_split)
        n = len(data) if limit is None else min(limit, len(data))
        settings = SearchSettings()
        ids = dict(bos_id=self.bos_id, eos_id=self.eos_id, pad_id=self.pad_id)
        hyps: list[str] = []
        refs: list[str] = []
        for start in range(0, n, 64):
            batch = range(start, min(start + 64, n))
            src = source_batch([data.src[i] for i in batch]).to(self.device)
            if beam:
                out = [
                    nbest[0].tokens
                    for nbest in beam_search(
                        self.model, src, beam_size=settings.beam, alpha=settings.alpha,
                        max_len_b=settings.max_len_b, **ids,
                    )
                ]  # fmt: skip
            else:
                out = greedy_search(self.model, src, max_len_b=settings.max_len_b, **ids)
            hyps.extend(sp.decode(list(map(int, tokens))) for tokens in out)
            # the references as the vocabulary encoded them: lowercased by a lowercasing
            # vocabulary, so that its BLEU is case-insensitive like the score stage's
            refs.extend(sp.decode(data.tgt[i].astype(int).tolist()) for i in batch)
        # BLEU tokenised for the target language, as the score stage does
        tokenize = bleu_tokenizer(getattr(self.trainer.datamodule, "tgt_lang", ""))
        return float(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score)

    # --- optimisation (§5.3) -------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.train_cfg
        # Lightning has moved the model to its device by now: fused Adam where torch has it.
        # Not with fp16's loss scaler: fused Adam unscales inside its step, so Lightning would
        # not unscale before on_before_optimizer_step, and the per-token rescaling, the gradient
        # norm and its clipping must see the unscaled gradients.
        trainer = self._trainer  # None when called outside fit (tests, tools)
        precision = trainer.precision if trainer is not None else self.train_cfg.precision
        fused = self.device.type in FUSED_ADAM_DEVICES and precision != "16-mixed"
        optimizer = build_optimizer(
            self.parameters(),
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            fused=True if fused else None,
        )
        scheduler = build_scheduler(
            optimizer,
            d_model=self.cfg.d_model,
            warmup=cfg.warmup,
            scale=cfg.lr_scale,
            cooldown_steps=cfg.lr_cooldown_steps,
            max_steps=cfg.max_steps,
        )
        # "step": the schedule advances once per optimizer update, not per epoch.
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }
