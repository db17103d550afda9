"""A run directory and its files: ``layout`` names each file of ``results/runs/<experiment>/`` and
who writes it; ``checkpoints`` is the checkpoint and model-file format (naming, discovery,
save/load, §6.1 averaging); ``metrics_history`` is the format of ``metrics.csv``. Nothing here
imports Lightning, training or inference code, so every stage can read a run directory."""
