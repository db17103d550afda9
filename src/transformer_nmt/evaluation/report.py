"""The results report: every experiment × test set × score, beside the paper's Table 2.

Score files are ``results/runs/{experiment}/{test_set}.scores.json`` (written by ``score``); the
experiment and test set names come from the path. What each experiment is (dataset, pair,
preset) comes from the config, so the paper's number can be put beside the WMT14 rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.errors import DataError

SCORES_SUFFIX = ".scores.json"

# Vaswani et al. 2017, Table 2: BLEU on newstest2014 (tokenized, compound-split; see score.py).
# Keyed by (dataset, pair, preset). EN-FR big is 41.8 in the final version (41.0 in arXiv v1).
PAPER_TABLE2: dict[tuple[str, str, str], float] = {
    ("wmt14_en_de", "en-de", "base"): 27.3,
    ("wmt14_en_de", "en-de", "big"): 28.4,
    ("wmt14_en_fr", "en-fr", "base"): 38.1,
    ("wmt14_en_fr", "en-fr", "big"): 41.8,
}
PAPER_TEST_SET = "newstest2014"

_SCORE_KEYS = ("bleu", "chrf", "bleu_paper", "bleu_lc_tok")


@dataclass(frozen=True)
class ReportRow:
    experiment: str
    test_set: str
    dataset: str | None
    pair: str | None
    preset: str | None
    sentences: int
    scores: dict[str, float]  # key in _SCORE_KEYS -> score
    signatures: dict[str, str]  # "bleu"/"chrf" -> sacreBLEU signature

    @property
    def paper_bleu(self) -> float | None:
        """The paper's Table 2 number for this row, if it is a Table 2 setting."""
        if self.test_set != PAPER_TEST_SET or None in (self.dataset, self.pair, self.preset):
            return None
        return PAPER_TABLE2.get((self.dataset, self.pair, self.preset))  # type: ignore[arg-type]


def _require(data: Mapping[str, Any], key: str, path: Path) -> Any:
    if key not in data:
        raise DataError(f"{path}: missing key '{key}' (not a scores file written by 'score')")
    return data[key]


def load_row(path: str | Path, experiments: Mapping[str, Mapping[str, Any]]) -> ReportRow:
    """Read one ``{experiment}/{test_set}.scores.json`` file."""
    path = Path(path)
    if not path.name.endswith(SCORES_SUFFIX):
        raise DataError(f"{path}: a scores file must be named <test_set>{SCORES_SUFFIX}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object")
    experiment = path.parent.name
    scores: dict[str, float] = {}
    for key in _SCORE_KEYS:
        entry = _require(data, key, path)
        if not isinstance(entry, dict) or not isinstance(entry.get("score"), int | float):
            raise DataError(f"{path}: key '{key}' has no numeric 'score'")
        scores[key] = float(entry["score"])
    info = experiments.get(experiment, {})
    return ReportRow(
        experiment=experiment,
        test_set=path.name[: -len(SCORES_SUFFIX)],
        dataset=info.get("dataset"),
        pair=info.get("pair"),
        preset=info.get("preset"),
        sentences=int(_require(data, "sentences", path)),
        scores=scores,
        signatures={k: str(data[k].get("signature", "")) for k in ("bleu", "chrf")},
    )


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def render_report(rows: Iterable[ReportRow]) -> str:
    """Markdown: one table row per experiment × test set, then the metric signatures."""
    rows = sorted(rows, key=lambda r: (r.experiment, r.test_set))
    if not rows:
        raise DataError("no scores to report")
    lines = [
        "# Results",
        "",
        "BLEU and chrF are sacreBLEU on detokenised text (the primary, reproducible numbers; "
        "signatures below). *Tok. BLEU* is the paper-comparable score: Moses tokenization, "
        "`##AT##-##AT##` compound splitting and BLEU on tokens, as the paper's evaluation "
        "(tensor2tensor `get_ende_bleu.sh`); *paper* is Vaswani et al. 2017, Table 2, on "
        f"{PAPER_TEST_SET}. *lc tok. BLEU* is lowercased tokenized BLEU, the kind the Multi30k "
        "literature reports (every letter lowercased, also non-ASCII; `multi-bleu.perl -lc` "
        "lowercases ASCII only, so it is close but not equal).",
        "",
        "| experiment | data | preset | test set | sentences | BLEU | chrF | tok. BLEU | paper "
        "| lc tok. BLEU |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        data = f"{r.dataset} {r.pair}" if r.dataset and r.pair else "—"
        lines.append(
            f"| {r.experiment} | {data} | {r.preset or '—'} | {r.test_set} | {r.sentences} "
            f"| {_fmt(r.scores['bleu'])} | {_fmt(r.scores['chrf'])} "
            f"| {_fmt(r.scores['bleu_paper'])} | {_fmt(r.paper_bleu)} "
            f"| {_fmt(r.scores['bleu_lc_tok'])} |"
        )
    lines += ["", "## Signatures", ""]
    for metric in ("bleu", "chrf"):
        for signature in sorted({r.signatures[metric] for r in rows if r.signatures[metric]}):
            lines.append(f"- {metric.upper() if metric == 'bleu' else 'chrF'}: `{signature}`")
    return "\n".join(lines) + "\n"


def build_report(
    score_paths: Iterable[str | Path], experiments: Mapping[str, Mapping[str, Any]]
) -> str:
    """Read every scores file and render the report."""
    rows = [load_row(p, experiments) for p in score_paths]
    seen: dict[tuple[str, str], ReportRow] = {}
    for row in rows:
        key = (row.experiment, row.test_set)
        if key in seen:
            raise DataError(f"scores for {key[0]} / {key[1]} given twice")
        seen[key] = row
    return render_report(rows)
