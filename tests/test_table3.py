"""The Table 3 study and seeds as config keys: expansion into runs, config errors, the report's
Table 3 section (paper values, our parameters, deltas from the base row)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.test_recipes import _dry_run, _load
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.evaluation.table3 import read_run_dev, render_table3, table3_entries
from transformer_nmt.experiments import Pipeline
from transformer_nmt.model.config import TABLE3, table3_config

GPU_RECIPE = REPO_ROOT / "config" / "experiments" / "table3_multi30k.yaml"
CPU_CONFIG = REPO_ROOT / ".test" / "config" / "table3.yaml"


def test_table3_holds_the_papers_numbers() -> None:
    # Vaswani et al. 2017, Table 3: (params x 10^6, dev PPL, dev BLEU) on newstest2013
    paper = {
        "base": (65, 4.92, 25.8), "A1": (65, 5.29, 24.9), "A2": (65, 5.00, 25.5),
        "A3": (65, 4.91, 25.8), "A4": (65, 5.01, 25.4), "B1": (58, 5.16, 25.1),
        "B2": (60, 5.01, 25.4), "C1": (36, 6.11, 23.7), "C2": (50, 5.19, 25.3),
        "C3": (80, 4.88, 25.5), "C4": (28, 5.75, 24.5), "C5": (168, 4.66, 26.0),
        "C6": (53, 5.12, 25.4), "C7": (90, 4.75, 26.2), "D1": (65, 5.77, 24.6),
        "D2": (65, 4.95, 25.5), "D3": (65, 4.67, 25.3), "D4": (65, 5.47, 25.7),
        "E": (65, 4.92, 25.7), "big": (213, 4.33, 26.4),
    }  # fmt: skip
    assert {
        n: (r.paper_params_m, r.paper_dev_ppl, r.paper_dev_bleu) for n, r in TABLE3.items()
    } == (paper)
    assert TABLE3["big"].paper_train_steps == 300_000
    assert {r.paper_train_steps for n, r in TABLE3.items() if n != "big"} == {100_000}
    assert TABLE3["A1"].overrides_dict() == {"h": 1, "d_k": 512, "d_v": 512}
    assert TABLE3["E"].overrides_dict() == {"positional": "learned"}
    assert TABLE3["D3"].overrides_dict() == {"eps_ls": 0.0}
    assert table3_config("C4").d_model == 256 and table3_config("C4").h == 8


def _cpu_config() -> dict[str, Any]:
    return _load(CPU_CONFIG)


def test_rows_and_seeds_expand_into_runs_sharing_the_base() -> None:
    config = _cpu_config()
    pipeline = Pipeline(config)
    (base,) = config["experiments"]
    seeds = config["experiments"][base]["seeds"]
    rows = config["table3"]["rows"]
    expected = {f"{name}.seed{s}" for name in [base, *(f"{base}.{r}" for r in rows)] for s in seeds}
    assert set(pipeline.experiments()) == expected
    assert pipeline.table3_rows == {"base": base, **{r: f"{base}.{r}" for r in rows}}
    own = config["experiments"][base]
    for row in rows:
        for seed in seeds:
            run = pipeline.experiment(f"{base}.{row}.seed{seed}")
            settings = pipeline.train_config(f"{base}.{row}.seed{seed}")
            # the row's paper values on top of the base's own overrides; the base's budget
            assert settings["model"]["overrides"] == {
                **own["model_overrides"],
                **TABLE3[row].overrides_dict(),
            }
            assert settings["train"] == {**own["train"], "seed": seed}
            assert "seeds" not in run and run["test_sets"] == own["test_sets"]
    assert pipeline.groups[base] == [f"{base}.seed{s}" for s in seeds]
    studies = pipeline.report_studies()
    assert studies["table3"] == pipeline.table3_rows
    assert studies["significance"]["baseline"] == config["significance"]["baseline"]
    assert set(studies["significance"]["runs"]) == {base, *(f"{base}.{r}" for r in rows)}
    assert len(pipeline.report_summaries()) == len(expected)


def test_the_gpu_recipe_expands_every_row_of_table3() -> None:
    config = _load(GPU_RECIPE)
    pipeline = Pipeline(config)
    base = config["table3"]["base"]
    assert set(config["table3"]["rows"]) == set(TABLE3) - {"base"}
    assert len(pipeline.experiments()) == len(TABLE3)
    assert pipeline.experiment(f"{base}.A1")["model_overrides"]["h"] == 1
    assert pipeline.experiment(f"{base}.big")["train"] == pipeline.experiment(base)["train"]
    assert config["experiments"][base]["preset"] == "base"
    assert config["significance"]["baseline"] == base


def test_dry_run_of_the_gpu_recipe_plans_every_row(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, "--configfile", str(GPU_RECIPE))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    base = _load(GPU_RECIPE)["table3"]["base"]
    trains = [ln for ln in out.splitlines() if "python -m transformer_nmt train " in ln]
    assert len(trains) == len(TABLE3)
    assert any(f"--run-dir results/runs/{base}.C5 " in cmd for cmd in trains)
    (report,) = [ln for ln in out.splitlines() if "python -m transformer_nmt report " in ln]
    assert '"table3":{' in report and f'"A1":"{base}.A1"' in report


def _bad(config: dict[str, Any], edit: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    edit(config)
    return config


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["table3"].update(rows=["F9"]),
            r"^table3\.rows: unknown Table 3 row 'F9' \(rows: A1, ",
        ),
        (lambda c: c["table3"].update(base="nope"), r"^table3\.base: 'nope' is not an experiment"),
        (
            lambda c: c["significance"].update(baseline="nope"),
            r"^significance\.baseline: 'nope' is not an experiment",
        ),
        (
            lambda c: next(iter(c["experiments"].values()))["train"].pop(
                "val_beam_bleu_every_steps"
            ),
            r"^table3\.base: Table 3's dev numbers .*\.train\.val_beam_bleu_every_steps",
        ),
    ],
)
def test_study_errors_name_the_key(edit: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Pipeline(_bad(_cpu_config(), edit))


def test_seed_counts_must_pair_with_the_baseline() -> None:
    def edit(config: dict[str, Any]) -> None:
        (base,) = config["experiments"]
        other = copy.deepcopy(config["experiments"][base])
        config["experiments"]["other"] = {**other, "seeds": [1, 2, 3]}

    with pytest.raises(ConfigError, match=r"^significance\.baseline: .* has 2 seeds but 'other'"):
        Pipeline(_bad(_cpu_config(), edit))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: next(iter(c["experiments"].values())).update(seeds=[]), r"seeds: \[\] should"),
        (lambda c: c["table3"].update(rowz=[]), r"^config: table3: unknown key 'rowz'"),
        (lambda c: c["significance"].update(resamples=0), r"resamples: 0 is less than"),
    ],
)
def test_schema_errors_are_one_line(tmp_path: Path, edit: Any, message: str) -> None:
    config = _bad(_cpu_config(), edit)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _dry_run(tmp_path, "--configfile", str(bad))
    assert result.returncode != 0
    (line,) = [ln for ln in (result.stdout + result.stderr).splitlines() if "config: " in ln]
    assert __import__("re").search(message, line), line


def _summary(run_dir: Path, ppl: float, bleu: float, **model: Any) -> None:
    run_dir.mkdir(parents=True)
    payload = {
        "model_config": {"N": 1, "d_model": 64, **model},
        "vocab": {"size": 600},
        "final_step": 20,
        "metrics": {"val/ppl": ppl, "val/bleu_beam": bleu, "val/step": 20},
    }
    (run_dir / "train_summary.json").write_text(json.dumps(payload), encoding="utf-8")


def test_table3_section_puts_ours_beside_the_papers(tmp_path: Path) -> None:
    _summary(tmp_path / "b.seed1", 10.0, 20.0)
    _summary(tmp_path / "b.seed2", 12.0, 22.0)
    _summary(tmp_path / "b.E.seed1", 9.0, 25.0, positional="learned")
    _summary(tmp_path / "b.E.seed2", 9.0, 27.0, positional="learned")
    runs = {p.name: read_run_dev(p) for p in tmp_path.iterdir()}
    assert runs["b.seed1"].dev_ppl == 10.0 and runs["b.seed1"].step == 20
    groups = {"b": ["b.seed1", "b.seed2"], "b.E": ["b.E.seed1", "b.E.seed2"]}
    params = {name: 1000 + i for i, name in enumerate(sorted(runs))}
    entries = table3_entries({"E": "b.E", "base": "b"}, groups, runs, params)
    assert [e.row for e in entries] == ["base", "E"]  # the paper's order
    text = render_table3(entries, "multi30k en-de valid")
    rows = [ln.split("|")[1:-1] for ln in text.splitlines() if ln.startswith("| E ")]
    cells = [c.strip() for c in rows[0]]
    # row, experiment, changes, params (ours, paper), PPL (ours, paper, Δ, paper Δ),
    # BLEU (ours, paper, Δ, paper Δ), step
    assert cells == [
        "E", "b.E", "positional=learned", f"{params['b.E.seed1'] / 1e6:.2f}", "65",
        "9.00 ± 0.00", "4.92", "-2.00", "+0.00", "26.00 ± 1.41", "25.7", "+5.00", "-0.1", "20",
    ]  # fmt: skip


def test_a_missing_summary_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="train_summary.json: file not found"):
        read_run_dev(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "train_summary.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match="missing key 'model_config'"):
        read_run_dev(tmp_path / "x")


def _scored_run(
    runs: Path, run: str, hyps: list[str], refs: Path, ppl: float, **model: Any
) -> Path:
    """A finished run: train summary, hypotheses and a scores file naming them."""
    import sacrebleu

    _summary(runs / run, ppl, 20.0, **model)
    hyp = runs / run / "t.hyp"
    hyp.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    ref_lines = refs.read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(hyps, [ref_lines]).score
    payload = {"hyp": str(hyp), "ref": str(refs), "sentences": len(hyps)}
    for key in ("bleu", "chrf", "bleu_paper", "bleu_lc_tok"):
        payload[key] = {"score": bleu, "signature": "x"}
    path = runs / run / "t.scores.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def test_report_cli_adds_the_study_sections(tmp_path: Path) -> None:
    from tests.test_significance import BAD, GOOD, REFS
    from transformer_nmt.cli import main
    from transformer_nmt.cli.info import count
    from transformer_nmt.model.config import ModelConfig

    runs = tmp_path / "runs"
    refs = tmp_path / "t.de"
    refs.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    paths = [
        _scored_run(runs, "b.seed1", BAD, refs, 10.0),
        _scored_run(runs, "b.seed2", BAD, refs, 12.0),
        _scored_run(runs, "b.E.seed1", GOOD, refs, 9.0, positional="learned"),
        _scored_run(runs, "b.E.seed2", GOOD, refs, 9.5, positional="learned"),
    ]
    groups = {"b": ["b.seed1", "b.seed2"], "b.E": ["b.E.seed1", "b.E.seed2"]}
    studies = {
        "groups": groups,
        "table3": {"base": "b", "E": "b.E"},
        "significance": {"baseline": "b", "resamples": 100, "runs": groups},
    }
    info = {"dataset": "multi30k", "pair": "en-de", "preset": "tiny"}
    out = tmp_path / "report.md"
    args = ["report", "--scores", *map(str, paths), "--out", str(out), "--runs-dir", str(runs),
            "--experiments", json.dumps({r: info for g in groups.values() for r in g}),
            "--studies", json.dumps(studies)]  # fmt: skip
    assert main(args) == 0
    text = out.read_text(encoding="utf-8")
    table3 = [ln for ln in text.split("## Table 3")[1].splitlines() if ln.startswith("| E ")]
    learned = count(ModelConfig(N=1, d_model=64, positional="learned"), 600)["parameters"]
    assert f"| E | b.E | positional=learned | {learned / 1e6:.2f} | 65 | 9.25 ± 0.35 |" in table3[0]
    assert "| b.E | t | 2 |" in text.split("## Seeds")[1]
    significance = text.split("## Significance")[1]
    (row,) = [ln for ln in significance.splitlines() if ln.startswith("| t | b.E |")]
    assert float(row.strip("|").split("|")[-1]) < 0.05  # clearly better than the baseline
    # a run without its summary: one line naming the file
    (runs / "b.E.seed2" / "train_summary.json").unlink()
    assert main(args) == 2


# --- Table 3 at another scale -------------------------------------------------------------------

STUDY = REPO_ROOT / "config" / "experiments" / "table3_cpu.yaml"


def test_relative_rows_are_the_papers_changes_scaled_to_the_base() -> None:
    from transformer_nmt.model.config import ModelConfig, table3_overrides

    base = ModelConfig(N=3, d_model=128, d_ff=512, h=8, d_k=16, d_v=16)
    assert table3_overrides("A1", base, "relative") == {"h": 1, "d_k": 128, "d_v": 128}
    assert table3_overrides("A4", base, "relative") == {"h": 32, "d_k": 4, "d_v": 4}
    assert table3_overrides("B1", base, "relative") == {"d_k": 4}
    assert table3_overrides("C1", base, "relative") == {"N": 1}
    assert table3_overrides("C3", base, "relative") == {"N": 4}
    assert table3_overrides("C5", base, "relative") == {"d_model": 256, "d_k": 32, "d_v": 32}
    assert table3_overrides("big", base, "relative") == {
        "d_model": 256, "d_ff": 1024, "h": 16, "p_drop": 0.3,
    }  # fmt: skip
    assert table3_overrides("D3", base, "relative") == {"eps_ls": 0.0}  # not a size: as is
    for row in TABLE3:  # (A) keeps h * d_k, as the paper does
        if row.startswith("A"):
            o = table3_overrides(row, base, "relative")
            assert o["h"] * o["d_k"] == base.h * base.d_k
    # the paper's scale: the paper's values
    assert table3_overrides("A1", base) == TABLE3["A1"].overrides_dict()
    with pytest.raises(ConfigError, match=r"row C1's N=2 .* scales the base's N=4 to 1.33333"):
        table3_overrides("C1", ModelConfig(N=4), "relative")


def test_the_cpu_study_expands_every_row_at_its_scale_with_seeds_where_given() -> None:
    config = _load(STUDY)
    pipeline = Pipeline(config)
    assert set(pipeline.table3_rows) == set(TABLE3)
    assert pipeline.groups["t3cpu"] == ["t3cpu.seed1", "t3cpu.seed2", "t3cpu.seed3"]
    assert pipeline.groups["t3cpu.A1"] == ["t3cpu.A1"]  # one run, the base's train.seed
    a1 = pipeline.experiment("t3cpu.A1")["model_overrides"]
    assert (a1["h"], a1["d_k"], a1["d_model"], a1["N"]) == (1, 128, 128, 3)
    assert pipeline.experiment("t3cpu.big")["model_overrides"]["d_ff"] == 1024
    steps = {pipeline.experiment(r)["train"]["max_steps"] for r in pipeline.experiments()}
    assert steps == {800}  # equal training steps for every row, stated in the file
    config["table3"]["seeds"]["A3"] = [1, 2, 3]
    assert Pipeline(config).groups["t3cpu.A3"] == [f"t3cpu.A3.seed{s}" for s in (1, 2, 3)]
    config["table3"]["seeds"]["F9"] = [1]
    with pytest.raises(ConfigError, match=r"table3.seeds: \['F9'\] are not rows"):
        Pipeline(config)


def test_verdicts_follow_the_papers_direction_and_the_p_value() -> None:
    from transformer_nmt.evaluation.significance import BootstrapResult
    from transformer_nmt.evaluation.table3 import RowTest, verdict

    def test(delta: float, p: float) -> RowTest:
        base = BootstrapResult(30.0, 30.0, 1.0, None, 100, 1)
        return RowTest("t", BootstrapResult(30.0 + delta, 30.0 + delta, 1.0, p, 100, 1), base)

    assert verdict(test(-1.0, 0.01), -0.9) == "holds"
    assert verdict(test(+1.0, 0.01), -0.9) == "reverses"
    assert verdict(test(+1.0, 0.20), -0.9) == "no significant difference"
    assert verdict(test(+0.1, 0.60), 0.0) == "holds (no difference)"
    assert verdict(test(+1.0, 0.01), 0.0) == "differs (paper: none)"
    assert verdict(test(-1.0, 0.05), -0.9) == "no significant difference"  # p < 0.05 strictly


def test_rows_within_twice_the_base_spread_are_named_for_more_seeds() -> None:
    from transformer_nmt.evaluation.table3 import Table3Entry, seed_candidates

    def entry(row: str, bleu: tuple[float, ...]) -> Table3Entry:
        return Table3Entry(row, row, 1, (), bleu, ())

    base = entry("base", (30.0, 31.0, 32.0))  # sd 1.0
    entries = [base, entry("A1", (29.5,)), entry("A2", (33.0,)), entry("A3", (33.5,)),
               entry("B1", (31.0, 31.2, 31.4))]  # fmt: skip
    spread, rows = seed_candidates(entries)
    assert spread == pytest.approx(1.0) and rows == ["A1", "A2"]  # B1 has seeds already
    text = render_table3(entries, "dev")
    assert "Rows within twice the base's seed spread (dev BLEU sd 1.00)" in text
    assert "`table3: {seeds: {A1: [1, 2, 3], A2: [1, 2, 3]}}`" in text
    assert seed_candidates([entry("base", (30.0,)), entry("A1", (30.0,))]) == (None, [])
