"""transformer_nmt: a reproducible pipeline for "Attention Is All You Need" (Vaswani et al.)."""

__version__ = "0.1.0"
