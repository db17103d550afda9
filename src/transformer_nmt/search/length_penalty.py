"""§6.1 length penalty of Wu et al. (2016, GNMT): lp(Y) = ((5 + |Y|) / 6)^alpha.

In this package |Y| counts every generated symbol of a finished hypothesis, its final EOS
included (as tensor2tensor, which the paper used): a hypothesis of n tokens followed by EOS has
|Y| = n + 1. Beam search ranks finished hypotheses by log P(Y | X) / lp(Y).
"""

from __future__ import annotations


def length_penalty(length: int, alpha: float) -> float:
    """((5 + length) / 6) ** alpha; alpha = 0 disables length normalisation."""
    return ((5.0 + length) / 6.0) ** alpha
