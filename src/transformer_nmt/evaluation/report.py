"""The results report: every experiment × test set × score, beside the paper's Table 2.

Score files are ``results/runs/{experiment}/{test_set}.scores.json`` (written by ``score``); the
experiment and test set names come from the path. What each experiment is (dataset, pair,
preset) comes from the config, so the paper's number can be put beside the WMT14 rows.
Beside each score, the test set's overlap with the training data comes from the pair's cleaning
report ``results/data/{dataset}/{pair}/clean_report.json`` (``splits.<test set>.train_overlap``,
written by ``prepare``), found from the scores file's place in ``results/runs/``.
Each BLEU and chrF is shown with its 95% bootstrap interval ``[low, high]`` when the scores file
has one (``ci95``, computed by ``score`` with sacreBLEU's bootstrap); older files show the bare
number. ``render_table_csv`` writes the same table as CSV (the Snakemake report's landing page).
``run_summary``: the BLEU of each scores file, the report's path and how to open the MLflow UI,
in a few lines that end a successful run's terminal output (the Snakefile's ``onsuccess``).
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import read_json
from transformer_nmt.runs.layout import ALPHA_SELECTION_FILE, EXPERIMENT_FILE, SELECTION_FILE
from transformer_nmt.tracking.store import sqlite_path

if TYPE_CHECKING:
    from transformer_nmt.evaluation.figures import ReportFigures

SCORES_SUFFIX = ".scores.json"
# Beside a run's scores: what the experiment is (written by the report stage, read by later
# reports of other configs) and the dev-set choice of averaged checkpoints (average --last auto).
CLEAN_REPORT = "clean_report.json"  # data.prepare.REPORT_NAME (not imported: numpy-free module)

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
_TOKENIZED_KEYS = ("bleu_paper", "bleu_lc_tok")  # null where Moses tokenization is undefined


@dataclass(frozen=True)
class ReportRow:
    experiment: str
    test_set: str
    dataset: str | None
    pair: str | None
    preset: str | None
    sentences: int
    scores: dict[str, float | None]  # key in _SCORE_KEYS -> score (None: undefined)
    signatures: dict[str, str]  # "bleu"/"chrf" -> sacreBLEU signature
    # key in _SCORE_KEYS -> the 95% bootstrap interval (low, high), when the scores file has it
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

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
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object")
    experiment = path.parent.name
    scores: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for key in _SCORE_KEYS:
        entry = _require(data, key, path)
        # Moses tokenization is not defined for the target language: "—"
        if key in _TOKENIZED_KEYS and isinstance(entry, dict) and entry.get("score") is None:
            scores[key] = None
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("score"), int | float):
            raise DataError(f"{path}: key '{key}' has no numeric 'score'")
        scores[key] = float(entry["score"])
        ci = entry.get("ci95")
        if ci is not None:
            try:
                intervals[key] = (float(ci["low"]), float(ci["high"]))
            except (TypeError, KeyError, ValueError) as err:
                raise DataError(
                    f"{path}: '{key}.ci95' needs numeric 'low' and 'high' ({err!r}); "
                    "re-run the score stage to rewrite it"
                ) from err
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
        intervals=intervals,
    )


def train_overlap_cell(score_path: Path, row: ReportRow) -> str:
    """ "pair 12/1000 (src 30, tgt 25)": the row's test sentences whose pair, source or target
    also occur in the training data, from ``<results>/data/<dataset>/<pair>/clean_report.json``
    (``<results>/runs/<experiment>/<test_set>.scores.json`` locates ``<results>``); "—" when
    the dataset is unknown or the report has no overlap for the test set."""
    if row.dataset is None or row.pair is None:
        return "—"
    path = score_path.parent.parent.parent / "data" / row.dataset / row.pair / CLEAN_REPORT
    if not path.is_file():
        return "—"
    try:
        overlap = json.loads(path.read_text(encoding="utf-8"))["splits"][row.test_set]
        overlap = overlap.get("train_overlap")
        if overlap is None:
            return "—"
        return (
            f"pair {int(overlap['pair'])}/{int(overlap['sentences'])} "
            f"(src {int(overlap['source'])}, tgt {int(overlap['target'])})"
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{path}: no train_overlap for {row.test_set} ({err!r})") from err


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _score_cell(row: ReportRow, key: str) -> str:
    """ "35.25 [34.10, 36.42]": the score and its 95% bootstrap interval, when known."""
    interval = row.intervals.get(key)
    if interval is None or row.scores[key] is None:
        return _fmt(row.scores[key])
    return f"{row.scores[key]:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


UI_HINT = (
    "Each experiment's MLflow run (params, curves, system metrics, datasets, scores with their "
    "intervals, how to re-run it): `make ui` (or `python -m transformer_nmt ui`) starts the "
    "MLflow UI on this store and prints each dataset pair's link to its runs "
    "(`…/#/experiments/<id>?workflowType=machine_learning`)."
)

TABLE_HEADER = (
    "experiment", "data", "preset", "test set", "sentences", "BLEU [95% CI]", "chrF [95% CI]",
    "tok. BLEU [95% CI]", "paper", "lc tok. BLEU [95% CI]", "train overlap",
)  # fmt: skip


def table_cells(
    rows: Iterable[ReportRow], overlaps: Mapping[tuple[str, str], str] | None = None
) -> list[list[str]]:
    """The results table's cells, one list per experiment × test set (``TABLE_HEADER``)."""
    overlaps = overlaps or {}
    return [
        [
            r.experiment,
            f"{r.dataset} {r.pair}" if r.dataset and r.pair else "—",
            r.preset or "—",
            r.test_set,
            str(r.sentences),
            _score_cell(r, "bleu"),
            _score_cell(r, "chrf"),
            _score_cell(r, "bleu_paper"),
            _fmt(r.paper_bleu),
            _score_cell(r, "bleu_lc_tok"),
            overlaps.get((r.experiment, r.test_set), "—"),
        ]
        for r in sorted(rows, key=lambda r: (r.experiment, r.test_set))
    ]


def render_table_csv(
    rows: Iterable[ReportRow], overlaps: Mapping[tuple[str, str], str] | None = None
) -> str:
    """The results table as CSV (header ``TABLE_HEADER``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TABLE_HEADER)
    writer.writerows(table_cells(rows, overlaps))
    return out.getvalue()


def dev_choice_section(
    title: str, intro: str, symbol: str, choices: Mapping[str, Mapping[str, Any]], best: str
) -> list[str]:
    """A report section of choices made on the dev set: per experiment its ``dev_bleu`` table
    (value -> BLEU, in the values' order) and the chosen value ``choices[name][best]``."""
    header = f"| experiment | {symbol} → dev BLEU | chosen {symbol} |"
    lines = ["", f"## {title}", "", intro, "", header, "|---|---|---:|"]
    for name, choice in sorted(choices.items()):
        table = ", ".join(
            f"{value}: {float(bleu):.2f}"
            for value, bleu in sorted(choice["dev_bleu"].items(), key=lambda kv: float(kv[0]))
        )
        lines.append(f"| {name} | {table} | {float(choice[best]):g} |")
    return lines


def render_report(
    rows: Iterable[ReportRow],
    selections: Mapping[str, Mapping[str, Any]] | None = None,
    overlaps: Mapping[tuple[str, str], str] | None = None,
    alphas: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """Markdown: one table row per experiment × test set, the checkpoint-averaging choices made
    on the dev set (``selections``: experiment -> ``average_selection.json``) and the length
    penalties (``alphas``: experiment -> ``alpha_selection.json``), then the metric
    signatures. ``overlaps``: (experiment, test set) -> ``train_overlap_cell``."""
    overlaps = overlaps or {}
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
        "lowercases ASCII only, so it is close but not equal). *train overlap*: test sentences "
        "whose (source, target) pair also occurs in the training data, and how many sources and "
        "targets do (NFKC, lowercased, whitespace collapsed; lines listed in clean_report.json). "
        "*[95% CI]*: sacreBLEU's bootstrap interval of the score (the test set's sentences "
        "resampled with replacement, the resamples in the signature as `bs:`): two systems whose "
        "intervals overlap may not differ; the config key `significance` tests a difference.",
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(rows, overlaps)]
    if selections:
        lines += dev_choice_section(
            "Checkpoint averaging chosen on the dev set",
            "`average_last_k: auto`: the average of the last K checkpoints with the best dev BLEU "
            "(beam search) is the model; §6.1 averages a fixed 5 (base) or 20 (big).",
            "K", selections, "best_k",
        )  # fmt: skip
    if alphas:
        lines += dev_choice_section(
            "Length penalty chosen on the dev set",
            "`translate.alpha: auto`: the averaged model translated the dev set under each α and "
            "the α with the best dev BLEU decoded the test sets; §6.1 chose 0.6 so.",
            "α", alphas, "best_alpha",
        )  # fmt: skip
    lines += ["", "## Signatures", ""]
    for metric in ("bleu", "chrf"):
        for signature in sorted({r.signatures[metric] for r in rows if r.signatures[metric]}):
            lines.append(f"- {metric.upper() if metric == 'bleu' else 'chrF'}: `{signature}`")
    lines += ["", "## MLflow", "", UI_HINT]
    return "\n".join(lines) + "\n"


def collect_score_files(
    score_paths: Iterable[str | Path], runs_dir: str | Path | None
) -> list[Path]:
    """``score_paths`` plus every ``<runs_dir>/<experiment>/*.scores.json`` (the experiments
    of other configs: a recipe's report keeps the demo's rows)."""
    paths = [Path(p) for p in score_paths]
    if runs_dir is not None:
        given = {p.resolve() for p in paths}
        found = sorted(Path(runs_dir).glob(f"*/*{SCORES_SUFFIX}"))
        paths += [p for p in found if p.resolve() not in given]
    return paths


def known_experiments(
    score_paths: Iterable[Path], experiments: Mapping[str, Mapping[str, Any]]
) -> dict[str, Mapping[str, Any]]:
    """``experiments`` plus what the runs of other configs recorded in ``experiment.json``."""
    known: dict[str, Mapping[str, Any]] = {}
    for path in score_paths:
        name = path.parent.name
        record = path.parent / EXPERIMENT_FILE
        if name not in experiments and name not in known and record.is_file():
            known[name] = read_json(record)
    return {**known, **experiments}


@dataclass(frozen=True)
class ReportData:
    """What the report shows: a row per scores file, the dev-set selections beside them, the
    train-overlap cells."""

    rows: list[ReportRow]
    selections: dict[str, Any]
    overlaps: dict[tuple[str, str], str]
    alphas: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        return render_report(self.rows, self.selections, self.overlaps, self.alphas)

    def table_csv(self) -> str:
        return render_table_csv(self.rows, self.overlaps)


def read_report(
    score_paths: Iterable[str | Path], experiments: Mapping[str, Mapping[str, Any]]
) -> ReportData:
    """Read every scores file and the dev-set selections beside them."""
    paths = [Path(p) for p in score_paths]
    experiments = known_experiments(paths, experiments)
    rows = [load_row(p, experiments) for p in paths]
    selections, alphas = {}, {}
    for path in paths:
        selection = path.parent / SELECTION_FILE
        if selection.is_file():
            selections[path.parent.name] = read_json(selection)
        # only where the experiment chooses α (a file left from an earlier alpha: auto run
        # would describe translations that are no longer there)
        chosen = path.parent / ALPHA_SELECTION_FILE
        if experiments.get(path.parent.name, {}).get("alpha") == "auto" and chosen.is_file():
            alphas[path.parent.name] = read_json(chosen)
    seen: dict[tuple[str, str], ReportRow] = {}
    for row in rows:
        key = (row.experiment, row.test_set)
        if key in seen:
            raise DataError(f"scores for {key[0]} / {key[1]} given twice")
        seen[key] = row
    overlaps = {
        (r.experiment, r.test_set): train_overlap_cell(p, r)
        for p, r in zip(paths, rows, strict=True)
    }
    return ReportData(rows, selections, overlaps, alphas)


def run_summary(
    score_paths: Iterable[str | Path], report_path: str | Path, tracking_uri: str
) -> str:
    """What a finished run made, for the end of its terminal output: per experiment and test set
    the sacreBLEU with its 95% bootstrap interval (``score_paths``), where the report is, and how
    to open the MLflow UI on ``tracking_uri``. Only what exists is named (a run stopped early,
    ``--until``, has no scores or report yet); "" when none of it does. A scores file that cannot
    be read is one line naming it, not an error: the run it ends has succeeded."""
    results, problems = [], []
    for path in map(Path, score_paths):
        if not path.is_file():
            continue
        try:
            row = load_row(path, {})
        except DataError as err:
            problems.append(f"  {err}")
            continue
        results.append((row.experiment, row.test_set, _score_cell(row, "bleu")))
    lines = ["sacreBLEU [95% bootstrap interval]:"] if results or problems else []
    width = [max((len(r[i]) for r in results), default=0) for i in (0, 1)]
    lines += [f"  {e:<{width[0]}}  {t:<{width[1]}}  {bleu}" for e, t, bleu in results]
    lines += problems
    if Path(report_path).is_file():
        lines.append(f"report: {Path(report_path).resolve()}")
    ui = mlflow_ui_hint(tracking_uri)
    return "\n".join(lines + ([ui] if ui else []))


def mlflow_ui_hint(tracking_uri: str) -> str:
    """How to see the runs of ``tracking_uri``: a server's address to open, or the command that
    starts the MLflow UI on a store of files (``python -m transformer_nmt ui``, which also prints
    each experiment's link); "" for a SQLite store not created yet."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow UI: open {tracking_uri}"
    if tracking_uri.startswith("sqlite:"):
        db = sqlite_path(tracking_uri)
        if db is None or not db.is_file():  # an in-memory store, or none created yet
            return ""
    return (
        f"MLflow UI: MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)} python -m transformer_nmt ui"
    )


def render_figures(figures: ReportFigures, report_dir: str | Path) -> str:
    """Markdown section "Figures": per experiment its figures (``evaluation.figures``), every
    PNG other stages left in ``results/runs/<experiment>/figures/``, and why a figure is
    missing; then the figures of each dataset pair. Links are relative to ``report_dir`` (the
    report's directory), each figure followed by a link to its data (CSV)."""
    import os

    def link(path: Path) -> str:
        return Path(os.path.relpath(Path(path).resolve(), Path(report_dir).resolve())).as_posix()

    lines = ["", "## Figures", ""]
    for name in sorted(figures.runs):
        lines += [f"### {name}", ""]
        for fig in figures.runs[name]:
            data = f" ([data]({link(fig.csv)}))" if fig.csv is not None else ""
            lines += [f"![{name}: {fig.title}]({link(fig.png)})", "", f"*{fig.title}*{data}", ""]
        for png in figures.found.get(name, []):
            lines += [f"![{name}: {png.stem}]({link(png)})", "", f"*{png.stem}*", ""]
        lines += [f"- {note}" for note in figures.notes.get(name, [])]
        if figures.notes.get(name):
            lines.append("")
    for pair, fig in sorted(figures.pairs.items()):
        lines += [f"### {pair}: {', '.join(fig.experiments)}", ""]
        data = f" ([data]({link(fig.csv)}))" if fig.csv is not None else ""
        lines += [f"![{pair}: {fig.title}]({link(fig.png)})", "", f"*{fig.title}*{data}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
