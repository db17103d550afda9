"""Scoring translations with sacreBLEU, the primary number and the paper-comparable one.

Three views of the same hypotheses:

- ``bleu`` and ``chrf``: sacreBLEU on detokenised text, with the metric signature. This is the
  primary, reproducible number (Post, 2018). BLEU's tokenisation follows the target language
  (``bleu_tokenizer``, sacreBLEU's own defaults): ``zh`` for Chinese, ``ja-mecab`` / ``ko-mecab``
  for Japanese / Korean (``char`` where sacreBLEU's extra ``sacrebleu[ja]`` / ``[ko]`` is not
  installed), ``char`` for the scripts written without spaces between words (Thai, Lao, Khmer,
  Burmese, Tibetan), ``13a`` otherwise; the signature names it (``tok:``).
- ``bleu_paper``: what the paper reported (§6.1, Table 2). The paper's scores came from
  tensor2tensor's ``get_ende_bleu.sh``: Moses ``tokenizer.perl -l <lang>`` on hypotheses and
  references, compound splitting ``a-b`` -> ``a ##AT##-##AT## b``, then ``multi-bleu.perl``
  (case-sensitive BLEU on the tokens, no smoothing). We use sacremoses for the Moses step and
  sacreBLEU with ``tokenize="none", smooth_method="none"`` for multi-bleu.
- ``bleu_lc_tok``: lowercased BLEU on Moses-tokenised text, the kind of number the Multi30k
  literature reports. Close to, not equal to, ``multi-bleu.perl -lc``: sacreBLEU lowercases
  with Python's ``str.lower`` (every letter, ``Ä`` -> ``ä``), Perl's ``lc`` without a UTF-8
  locale only ASCII letters, so German nouns with umlauts may count differently.

The two tokenized BLEUs are defined only where Moses tokenization is (languages that separate
words with spaces, ``moses_tokenizable``); elsewhere their ``score`` is null (the report shows
"—") and ``method`` says why.

``lowercase=True`` (the score stage's ``--lowercase``, for a model whose vocabulary lowercases,
the data setting ``lowercase``) makes ``bleu``, ``chrf`` and ``bleu_paper`` case-insensitive:
sacreBLEU lowercases hypotheses and references (``case:lc`` in the signatures). ``bleu_lc_tok``
is case-insensitive either way.

Each score also carries its **95% bootstrap interval** (``ci95``), sacreBLEU's own
``corpus_score(..., n_bootstrap=N)`` (the ``sacrebleu --confidence`` code path, Koehn 2004): N
test sets drawn with replacement from the sentences, the interval the bootstrap mean ± half the
2.5-97.5 percentile range of their scores (``Score.estimate_ci``). The draws are seeded
(``$SACREBLEU_SEED``, default 12345) and the signature says so (``bs:N|seed:...``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import read_lines
from transformer_nmt.languages import space_separated

DEFAULT_RESAMPLES = 1000  # sacreBLEU's --confidence-n default

# tensor2tensor get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# Python's re.sub is non-overlapping left to right like perl's /g:
# "a-b-c" -> "a ##AT##-##AT## b-c", exactly as the perl one-liner does.
_COMPOUND = re.compile(r"(\S)-(\S)")

PAPER_BLEU_METHOD = (
    "sacremoses MosesTokenizer(lang, escape=True) on hyp and ref, compound splitting "
    "(\\S)-(\\S) -> '\\1 ##AT##-##AT## \\2', BLEU on tokens (sacreBLEU tokenize=none, "
    "smooth=none) = tensor2tensor get_ende_bleu.sh + multi-bleu.perl"
)
LC_TOK_BLEU_METHOD = (
    "sacremoses MosesTokenizer(lang, escape=True) on hyp and ref, lowercased BLEU on tokens "
    "(sacreBLEU tokenize=none, lowercase of every letter, smooth=none) ~ multi-bleu.perl -lc "
    "(which lowercases ASCII letters only)"
)


# sacreBLEU's own choices (BLEU(trg_lang=...)): zh, ja-mecab, ko-mecab; every other language
# written without spaces between words (languages.UNSEGMENTED): char; the rest 13a.
_TOKENIZER_BY_LANGUAGE = {"zh": "zh", "yue": "zh", "cmn": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
_NEEDS_EXTRA = ("ja-mecab", "ko-mecab")  # MeCab: sacreBLEU's extras sacrebleu[ja] / [ko]


def tokenizer_available(name: str) -> bool:
    """Whether sacreBLEU can build tokenizer ``name`` here (the MeCab ones need an extra)."""
    try:
        BLEU(tokenize=name)
    except (RuntimeError, ImportError, ModuleNotFoundError):
        return False
    return True


def bleu_tokenizer(tgt_lang: str) -> str:
    """sacreBLEU's tokenizer for BLEU on ``tgt_lang`` (see the module docstring): there is one
    for every code (13a needs no language), so no code is refused."""
    chosen = _TOKENIZER_BY_LANGUAGE.get(tgt_lang, "13a" if space_separated(tgt_lang) else "char")
    if chosen in _NEEDS_EXTRA and not tokenizer_available(chosen):
        return "char"  # sacreBLEU's extra is not installed: characters, named in the signature
    return chosen


def moses_tokenizable(tgt_lang: str) -> bool:
    """Whether Moses tokenization (the paper's tokenized BLEU) is defined for ``tgt_lang``:
    the language separates words with spaces."""
    return space_separated(tgt_lang)


def undefined_score(tgt_lang: str) -> dict[str, Any]:
    """A tokenized BLEU where Moses tokenization is not defined: no score, and why."""
    return {
        "score": None,
        "method": f"not defined for '{tgt_lang}': Moses tokenization needs spaces between words",
    }


@dataclass(frozen=True)
class ScoreSet:
    """The scores of one hypothesis file against one reference file."""

    sentences: int
    bleu: dict[str, Any]
    chrf: dict[str, Any]
    bleu_paper: dict[str, Any]
    bleu_lc_tok: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sentences": self.sentences,
            "bleu": self.bleu,
            "chrf": self.chrf,
            "bleu_paper": self.bleu_paper,
            "bleu_lc_tok": self.bleu_lc_tok,
        }


def split_compounds(tokenized: str) -> str:
    """tensor2tensor's ``##AT##`` compound splitting of an already Moses-tokenised line."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses ``tokenizer.perl -l lang`` (with its default XML escaping) via sacremoses."""
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def _corpus_score(metric: BLEU | CHRF, hyps: list[str], refs: list[str], resamples: int) -> Any:
    """``metric.corpus_score`` with ``resamples`` bootstrap draws. sacreBLEU 2.x scores a chrF
    resample in which no character n-gram matches as a Python 0.0 beside numpy float32s, and
    its interval estimate (``statistics.mean``) then raises TypeError: an almost empty
    translation (a model that has barely trained) fails there. Then the same draws (sacreBLEU's
    own resampling, its seed) are estimated with every score a float."""
    try:
        return metric.corpus_score(hyps, [refs], n_bootstrap=resamples)
    except TypeError:
        if resamples <= 1:
            raise
    from sacrebleu.significance import _bootstrap_resample

    stats = metric._extract_corpus_statistics(hyps, [refs])
    result = metric._aggregate_and_compute(stats)
    metric.n_bootstrap = resamples
    metric.seed, draws = _bootstrap_resample(stats, metric, resamples)
    for draw in draws:
        draw.score = float(draw.score)
    result.estimate_ci(draws)
    return result


def _score_dict(
    metric: BLEU | CHRF, hyps: Sequence[str], refs: Sequence[str], resamples: int
) -> tuple[Any, dict[str, Any]]:
    """sacreBLEU's score of ``hyps`` and, with ``resamples`` > 1, its bootstrap interval
    ``ci95``: ``{"low", "high", "mean", "resamples"}``."""
    result = _corpus_score(metric, list(hyps), list(refs), resamples)
    entry: dict[str, Any] = {"score": float(result.score)}
    if resamples > 1:
        # sacreBLEU's own estimate (Score.estimate_ci, what `sacrebleu --confidence` prints as
        # "μ = mean ± ci"); the Score keeps it in these two attributes only.
        mean, half = result._mean, result._ci
        entry["ci95"] = {
            "low": float(mean - half),
            "high": float(mean + half),
            "mean": float(mean),
            "resamples": resamples,
        }
    entry["signature"] = str(metric.get_signature())
    return result, entry


def _bleu_dict(
    metric: BLEU, hyps: Sequence[str], refs: Sequence[str], resamples: int
) -> dict[str, Any]:
    result, entry = _score_dict(metric, hyps, refs, resamples)
    entry.update(
        precisions=[float(p) for p in result.precisions],
        bp=float(result.bp),
        sys_len=int(result.sys_len),
        ref_len=int(result.ref_len),
    )
    return entry


def score_lines(
    hyps: Sequence[str],
    refs: Sequence[str],
    tgt_lang: str,
    resamples: int = DEFAULT_RESAMPLES,
    *,
    lowercase: bool = False,
) -> ScoreSet:
    """Score aligned hypothesis and reference lines (same length, one sentence each); each
    score with its 95% bootstrap interval from ``resamples`` draws (0 or 1: none);
    ``lowercase``: every score case-insensitive."""
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise DataError("nothing to score: no sentences")

    bleu_metric = BLEU(tokenize=bleu_tokenizer(tgt_lang), lowercase=lowercase)
    bleu = _bleu_dict(bleu_metric, hyps, refs, resamples)
    _, chrf = _score_dict(CHRF(lowercase=lowercase), hyps, refs, resamples)
    if not moses_tokenizable(tgt_lang):
        none = undefined_score(tgt_lang)
        return ScoreSet(len(hyps), bleu, chrf, dict(none), dict(none))

    hyps_tok = moses_tokenize(hyps, tgt_lang)
    refs_tok = moses_tokenize(refs, tgt_lang)
    on_tokens = {"tokenize": "none", "force": True, "smooth_method": "none"}
    bleu_paper = _bleu_dict(
        BLEU(lowercase=lowercase, **on_tokens),
        [split_compounds(h) for h in hyps_tok],
        [split_compounds(r) for r in refs_tok],
        resamples,
    )
    bleu_paper["method"] = PAPER_BLEU_METHOD
    bleu_lc_tok = _bleu_dict(BLEU(lowercase=True, **on_tokens), hyps_tok, refs_tok, resamples)
    bleu_lc_tok["method"] = LC_TOK_BLEU_METHOD
    return ScoreSet(len(hyps), bleu, chrf, bleu_paper, bleu_lc_tok)


def score_files(
    hyp_path: str | Path,
    ref_path: str | Path,
    tgt_lang: str,
    resamples: int = DEFAULT_RESAMPLES,
    *,
    lowercase: bool = False,
) -> ScoreSet:
    """Score a hypothesis file against a reference file; line counts must match."""
    hyps = read_lines(hyp_path)
    refs = read_lines(ref_path)
    if len(hyps) != len(refs):
        raise DataError(
            f"line count mismatch: {hyp_path} has {len(hyps)} lines "
            f"but {ref_path} has {len(refs)} lines"
        )
    if not hyps:
        raise DataError(f"nothing to score: {hyp_path} and {ref_path} are empty")
    return score_lines(hyps, refs, tgt_lang, resamples, lowercase=lowercase)
