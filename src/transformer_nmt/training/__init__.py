"""Training: the objective and optimiser of §5.3-5.4 (``objective``), the LightningModule
(``module``) and the Lightning Trainer with checkpointing and resume (``trainer``)."""
