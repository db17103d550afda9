"""What the pipeline needs to know of a language code: its script's needs.

One home for it: SentencePiece's character coverage (``data/spm.py``) and BLEU's tokenisation
(``evaluation/score.py``) both follow it. Codes are ISO 639 (``zh``, ``ja``, ...), as in a pair's
name (``en-zh``); a code not listed here is a language written with spaces between words in an
alphabet of modest size (Latin, Cyrillic, Greek, Arabic, Devanagari, ...).
"""

from __future__ import annotations

# Written in CJK scripts: thousands of distinct characters.
CJK = frozenset({"zh", "cmn", "yue", "ja", "ko"})
# Written without spaces between words (Korean uses spaces, but sacreBLEU segments it with MeCab).
UNSEGMENTED = frozenset({"zh", "cmn", "yue", "ja", "ko", "th", "lo", "km", "my", "bo", "dz"})

# SentencePiece's character_coverage: the share of characters its vocabulary must cover. Its
# documentation recommends 0.9995 for languages with rich character sets (Japanese, Chinese)
# and 1.0 for small ones; 0.9999 keeps the odd rare letter of a Latin-script corpus out.
CHARACTER_COVERAGE_CJK = 0.9995
CHARACTER_COVERAGE_DEFAULT = 0.9999


def character_coverage(languages: list[str] | tuple[str, ...]) -> float:
    """SentencePiece's coverage for a joint vocabulary of ``languages``."""
    if any(lang in CJK for lang in languages):
        return CHARACTER_COVERAGE_CJK
    return CHARACTER_COVERAGE_DEFAULT


def space_separated(lang: str) -> bool:
    """Whether ``lang`` separates words with spaces (where Moses tokenization is defined)."""
    return lang not in UNSEGMENTED
