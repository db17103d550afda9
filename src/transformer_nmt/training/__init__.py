"""Training: §5.4's loss (``objective``, its kernels ``loss_kernels``), §5.3's optimiser and
schedule (``optimizer``), the LightningModule (``module``) and the Lightning Trainer with
checkpointing and resume (``trainer``)."""
