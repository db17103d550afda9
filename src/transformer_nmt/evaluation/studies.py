"""The report's study sections, computed from the runs' scores and summaries: Table 3 (each row
beside the paper's, with its verdict against the base row), the seeds (BLEU mean ± std), and
the significance of every experiment against a baseline (sacreBLEU's paired bootstrap); and
the MLflow metrics they add. ``cli/report.py`` calls ``study_sections``; the pipeline says
which runs form which study (``experiments.Pipeline.report_studies``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.score import bleu_tokenizer
from transformer_nmt.io_utils import read_lines


def _parameters(model_config: Mapping[str, Any], vocab_size: int) -> int:
    """Our parameter count of a run's model (built on the meta device: no memory)."""
    from transformer_nmt.model.config import ModelConfig
    from transformer_nmt.model.transformer import count_parameters_of

    return count_parameters_of(ModelConfig.from_dict(dict(model_config)), vocab_size)


def study_sections(
    studies: Mapping[str, Any],
    scores: Mapping[tuple[str, str], Mapping[str, Any]],
    runs_dir: Path,
    experiments: Mapping[str, Mapping[str, Any]],
    figures_dir: Path | None = None,
    report_dir: Path | None = None,
) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """The report's study sections (name -> Markdown: ``table3``, ``seeds``, ``significance``)
    and the metrics they add to MLflow runs (experiment or group -> metrics). With
    ``figures_dir``, Table 3's Δ BLEU figure too (``<figures_dir>/table3_delta_bleu.png``, linked
    relative to ``report_dir``)."""
    from transformer_nmt.evaluation import significance as sig
    from transformer_nmt.evaluation import table3
    from transformer_nmt.evaluation.figures import table3_delta_figure

    sections: dict[str, str] = {}
    metrics: dict[str, dict[str, float]] = {}
    groups = studies.get("groups") or {}
    results: dict[tuple[str, str], sig.BootstrapResult] = {}
    if groups:
        bleu = {key: float(data["bleu"]["score"]) for key, data in scores.items()}
        summaries = sig.seed_summaries(groups, bleu)
        if summaries:
            sections["seeds"] = sig.render_seeds(groups, summaries)
        for (name, test_set), summary in summaries.items():
            metrics.setdefault(name, {})[f"{test_set}.bleu_mean"] = summary.mean
            metrics[name][f"{test_set}.bleu_std"] = summary.std
    if studies.get("significance"):
        study = studies["significance"]
        baseline, resamples = study["baseline"], int(study.get("resamples", 1000))
        members: dict[str, list[str]] = study["runs"]

        def hypotheses(name: str, test_set: str) -> list[list[str]] | None:
            files = [scores.get((run, test_set)) for run in members[name]]
            if any(f is None for f in files):
                return None
            return [read_lines(f["hyp"]) for f in files]  # type: ignore[index]

        signatures = []
        test_sets = sorted({t for (run, t) in scores if run in members[baseline]})
        for test_set in test_sets:
            base_hyps = hypotheses(baseline, test_set)
            if base_hyps is None:
                continue
            base_scores = scores[(members[baseline][0], test_set)]
            refs = read_lines(base_scores["ref"])
            # BLEU tokenised and cased as the score stage did for the target language
            tokenize = bleu_tokenizer(str(base_scores.get("tgt_lang", "")))
            lowercase = bool(base_scores.get("lowercase", False))
            for name in sorted(members):
                if name == baseline:
                    continue
                hyps = hypotheses(name, test_set)
                if hyps is None:
                    continue
                try:
                    base_result, result, signature = sig.paired_bootstrap(
                        base_hyps, hyps, refs, resamples, tokenize, lowercase
                    )
                except DataError as err:
                    raise DataError(f"significance of {name} on {test_set}: {err}") from err
                results[(name, test_set)] = result
                results.setdefault((baseline, test_set), base_result)
                signatures.append(signature)
                low, high = result.interval
                metrics.setdefault(name, {}).update(
                    {
                        f"{test_set}.bleu_p_value": result.p_value,
                        f"{test_set}.bleu_paired_ci95_low": low,
                        f"{test_set}.bleu_paired_ci95_high": high,
                    }
                )
        if results:
            sections["significance"] = sig.render_significance(
                baseline, results, signatures, resamples
            )
    if studies.get("table3"):
        rows = studies["table3"]
        runs = [r for e in rows.values() for r in groups.get(e, [e])]
        devs = {run: table3.read_run_dev(runs_dir / run) for run in runs}
        params = {run: _parameters(d.model_config, d.vocab_size) for run, d in devs.items()}
        info = experiments.get(runs[0], {})
        dev_set = f"{info.get('dataset', '?')} {info.get('pair', '?')} valid"
        entries = table3.table3_entries(rows, groups, devs, params)
        tested = _table3_tests(rows, results if studies.get("significance") else {})
        sections["table3"] = table3.render_table3(entries, dev_set, tested)
        if tested and figures_dir is not None:
            png = table3_delta_figure(entries, tested, Path(figures_dir) / "table3_delta_bleu.png")
            link = os.path.relpath(png, report_dir or Path.cwd())
            sections["table3"] += (
                f"\n![Table 3: Δ BLEU against the base]({link})\n\n*Δ BLEU of each row against "
                f"the base, ours with its 95% interval, the paper's beside it* "
                f"([data]({os.path.relpath(png.with_suffix('.csv'), report_dir or Path.cwd())}))\n"
            )
    return sections, metrics


def _table3_tests(
    rows: Mapping[str, str], results: Mapping[tuple[str, str], Any]
) -> dict[str, Any]:
    """Each Table 3 row's paired bootstrap against the base row on the first test set that has
    them all (``table3.RowTest``); empty without a significance study against the base."""
    from transformer_nmt.evaluation.table3 import RowTest

    base = rows.get("base")
    for test_set in sorted({t for (_, t) in results}):
        if (base, test_set) not in results:
            continue
        return {
            row: RowTest(test_set, results[(exp, test_set)], results[(base, test_set)])
            for row, exp in rows.items()
            if row != "base" and (exp, test_set) in results
        }
    return {}
