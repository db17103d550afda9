"""Pure helpers of the benchmark scripts (benchmarks/ is not a package: loaded by path)."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def time_to_bleu():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_time_to_bleu", BENCHMARKS / "bench_time_to_bleu.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_minutes_to_bleu_interpolates_between_the_checkpoints_around_the_target(time_to_bleu):
    points = [(2.0, 10.0), (4.0, 26.0), (6.0, 34.0), (8.0, 29.0)]
    assert time_to_bleu.minutes_to_bleu(points, 30.0) == pytest.approx(5.0)


def test_minutes_to_bleu_first_checkpoint_and_not_reached(time_to_bleu):
    assert time_to_bleu.minutes_to_bleu([(1.5, 31.0), (3.0, 35.0)], 30.0) == 1.5
    assert time_to_bleu.minutes_to_bleu([(1.0, 30.0)], 30.0) == 1.0  # "at or above"
    assert time_to_bleu.minutes_to_bleu([(1.0, 12.0), (2.0, 29.9)], 30.0) is None
    assert time_to_bleu.minutes_to_bleu([], 30.0) is None


def test_curve_leaves_out_averages_and_other_sets(time_to_bleu):
    rows = [
        {"minutes": 1.0, "scores": {"valid": {"bleu": 5.0}}},
        {"minutes": 1.0, "averaged_steps": [1, 2], "scores": {"valid": {"bleu": 6.0}}},
        {"minutes": 2.0, "scores": {"test": {"bleu": 7.0}}},
    ]
    assert time_to_bleu.curve(rows, "valid") == [(1.0, 5.0)]


def test_sets_override_train_model_and_translate_keys_and_fix_alpha_auto(time_to_bleu):
    """Every checkpoint decodes with one α: the pipeline's ``alpha: auto`` (a dev search after
    averaging) becomes the paper's 0.6 unless ``--set translate.alpha=A`` names another."""
    exp = {"train": {"max_steps": 10}, "translate": {"beam": 4, "alpha": "auto"}}
    out = time_to_bleu.apply_sets(exp, ["train.max_steps=20", "model.d_model=64"])
    assert out["train"]["max_steps"] == 20 and out["model_overrides"] == {"d_model": 64}
    assert out["translate"]["alpha"] == 0.6 and exp["translate"]["alpha"] == "auto"
    assert time_to_bleu.apply_sets(exp, ["translate.alpha=1.6"])["translate"]["alpha"] == 1.6
    with pytest.raises(SystemExit, match="expected train.KEY=VALUE"):
        time_to_bleu.apply_sets(exp, ["data.vocab_size=10"])


def test_a_benchmarks_step_counts_win_over_the_configs_by_precision(time_to_bleu):
    """``harness.train_settings``: the overrides hold in every precision (a by_precision entry
    would otherwise put the config's 2,400 steps back in bf16), the entries' other keys stay,
    and an emptied entry stays so that ``precision: auto`` chooses as the config does."""
    from harness import train_settings

    from transformer_nmt.training.config import TrainConfig

    train = {"max_steps": 1600, "lr_cooldown_steps": 500,
             "by_precision": {"bf16-mixed": {"max_steps": 2400, "lr_cooldown_steps": 750},
                              "16-mixed": {"max_steps": 2000}}}  # fmt: skip
    settings = train_settings(train, max_steps=150, log_every_steps=10)
    assert settings["by_precision"] == {"bf16-mixed": {"lr_cooldown_steps": 750}, "16-mixed": {}}
    cfg = TrainConfig.from_dict(settings)
    assert cfg.for_precision("bf16-mixed").max_steps == cfg.for_precision("16-mixed").max_steps
    assert cfg.for_precision("bf16-mixed").max_steps == 150
    assert cfg.for_precision("bf16-mixed").lr_cooldown_steps == 750
    assert train["by_precision"]["bf16-mixed"]["max_steps"] == 2400  # the config is not changed
    assert train_settings({"max_steps": 5}, max_steps=7)["by_precision"] == {}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_learning_curves_of_two_runs_share_one_figure_and_its_csv(tmp_path, monkeypatch):
    plot = _load("plot_learning_curves")
    header = "step,elapsed_s,train_loss,lr,val_loss,val_ppl,val_bleu,val_bleu_beam\n"
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    new.write_text(header + "50,30.0,5.1,0.001,,,,\n100,60.0,4.2,0.002,3.9,9.5,,21.5\n")
    old.write_text(header + "1000,510.0,,,,9.56,,31.66\n")
    png = tmp_path / "figs" / "curves.png"
    monkeypatch.setattr(sys, "argv", ["plot", "--curve", f"bf16, a=b={new}",
                                      "--curve", f"fp32={old}", "--out", str(png)])  # fmt: skip
    plot.main()
    assert png.stat().st_size > 0
    with png.with_suffix(".csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    # the label is what precedes the last "=": it may hold "=" and commas
    assert [r["experiment"] for r in rows] == ["bf16, a=b", "bf16, a=b", "fp32"]
    assert [(r["step"], r["minutes"], r["val_bleu_beam"]) for r in rows] == [
        ("50", "0.5", ""),
        ("100", "1.0", "21.5"),
        ("1000", "8.5", "31.66"),
    ]


def test_a_curve_without_a_label_or_file_is_refused(tmp_path, monkeypatch):
    plot = _load("plot_learning_curves")
    with pytest.raises(Exception, match="LABEL=PATH"):
        plot.labelled_path(str(tmp_path / "metrics.csv"))
    monkeypatch.setattr(sys, "argv", ["plot", "--curve", f"x={tmp_path / 'none.csv'}",
                                      "--out", str(tmp_path / "f.png")])  # fmt: skip
    with pytest.raises(SystemExit, match="no file"):
        plot.main()


def test_a_train_memory_run_is_cut_to_its_steps_in_every_precision():
    from transformer_nmt.training.config import TrainConfig

    bench = _load("bench_train_memory")
    config = {"model": {"preset": "tiny"},
              "train": {"max_steps": 1600, "lr_cooldown_steps": 500, "val_every_steps": 1600,
                        "by_precision": {"bf16-mixed": {"max_steps": 2400, "val_every_steps": 2400,
                                                        "lr_cooldown_steps": 750}}}}  # fmt: skip
    cut = bench.cut_config(config, 400)
    assert cut["model"] == config["model"]
    cfg = TrainConfig.from_dict(cut["train"])
    for precision in ("bf16-mixed", "32-true"):
        run = cfg.for_precision(precision)
        assert (run.max_steps, run.val_every_steps, run.lr_cooldown_steps) == (400, 400, 100)
    no_cooldown = {"model": {}, "train": {"max_steps": 1600}}
    assert "lr_cooldown_steps" not in bench.cut_config(no_cooldown, 400)["train"]
    # the CPU recipe's beam-search dev BLEU every 1,000 updates: off, not a config error
    recipe = {"model": {}, "train": {"max_steps": 7000, "val_every_steps": 500,
                                     "val_beam_bleu_every_steps": 1000}}  # fmt: skip
    cut = TrainConfig.from_dict(bench.cut_config(recipe, 120)["train"])
    assert (cut.val_every_steps, cut.val_beam_bleu_every_steps) == (120, None)


def test_a_train_memory_row_sets_its_dotted_keys_over_every_precision():
    bench = _load("bench_train_memory")
    config = {"model": {"preset": "big", "overrides": {"p_drop": 0.3}},
              "train": {"fused_loss": "auto", "max_tokens": "auto",
                        "by_precision": {"bf16-mixed": {"max_tokens": 9000}}}}  # fmt: skip
    words = ["train.fused_loss=false", "train.max_tokens=512", "model.preset=tiny",
             "model.overrides.N=2"]  # fmt: skip
    settings = bench.harness.key_values(words, "--set")
    changed = bench.with_settings(config, settings)
    assert changed["train"]["fused_loss"] is False and changed["train"]["max_tokens"] == 512
    assert changed["train"]["by_precision"] == {"bf16-mixed": {}}  # the row's value wins
    assert changed["model"] == {"preset": "tiny", "overrides": {"p_drop": 0.3, "N": 2}}
    assert config["train"]["fused_loss"] == "auto"  # the recipe's config is left as it was
    for bad in ("fused_loss=false", "train.a.b=1", "model.d_model=64"):
        with pytest.raises(SystemExit):
            bench.with_settings(config, bench.harness.key_values([bad], "--set"))


def test_the_cuda_peak_hook_writes_the_childs_peak_at_its_exit(tmp_path):
    """The hook the train stage's child runs with: at exit, where torch used CUDA, the peak
    allocated and reserved bytes (a stand-in torch here); nothing where it did not."""
    import os
    import subprocess

    bench = _load("bench_train_memory")
    (tmp_path / "sitecustomize.py").write_text(bench.CUDA_PEAK_HOOK)
    fake = ("import sys, types; cuda = types.SimpleNamespace(is_initialized=lambda: {used}, "
            "max_memory_allocated=lambda: 5, max_memory_reserved=lambda: 7); "
            "sys.modules['torch'] = types.SimpleNamespace(cuda=cuda)")  # fmt: skip
    for used in (True, False):
        out = tmp_path / f"peak_{used}.json"
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "BENCH_CUDA_PEAK_FILE": str(out)}
        subprocess.run([sys.executable, "-c", fake.format(used=used)], env=env, check=True)
        if used:
            assert json.loads(out.read_text()) == {"allocated": 5, "reserved": 7}
        else:
            assert not out.exists()


def test_peer_recipe_minutes_add_up_invocations_to_their_resume_points():
    """A checkpoint's training minutes: the earlier invocations' time up to their last
    ``checkpoint_last.pt`` (what came after was trained again), then its own invocation's."""
    recipe = _load("bench_peer_recipe")
    segments = [
        {"started": 0.0, "ended": 600.0, "resume_at": 480.0},
        {"started": 1000.0, "ended": 1600.0, "resume_at": 1570.0},
        {"started": 2000.0},  # still running
    ]
    assert recipe.trained_minutes(300.0, segments) == pytest.approx(5.0)
    assert recipe.trained_minutes(1060.0, segments) == pytest.approx((480 + 60) / 60)
    assert recipe.trained_minutes(2120.0, segments) == pytest.approx((480 + 570 + 120) / 60)
    assert recipe.trained_minutes(800.0, segments) is None  # written by no invocation


def test_peer_recipe_compares_minutes_only_where_both_sides_reached_the_target():
    recipe = _load("bench_peer_recipe")
    peer = {"30.0": 40.0, "35.0": 80.0, "40.0": None}
    ours = {"30.0": 10.0, "35.0": None, "40.0": 50.0}
    assert recipe.minutes_ratios(peer, ours) == {"30.0": pytest.approx(0.25)}
    assert recipe.minutes_ratios(peer, {**ours, "35.0": 60.0})["35.0"] == pytest.approx(0.75)


def test_peer_recipe_reads_fairseqs_checkpoints_and_hypotheses_in_order(tmp_path):
    recipe = _load("bench_peer_recipe")
    for name in ("checkpoint2.pt", "checkpoint12.pt", "checkpoint_9_1000.pt",
                 "checkpoint_5_500.pt", "checkpoint_last.pt", "checkpoint_best.pt"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    by_update, by_epoch = recipe.checkpoints(tmp_path)
    assert [(n, p.name) for n, p in by_update] == [
        (500, "checkpoint_5_500.pt"), (1000, "checkpoint_9_1000.pt")]  # fmt: skip
    assert [n for n, _ in by_epoch] == [2, 12]  # numerically, not as text
    out = "S-1\tb c\nT-1\tx\nH-1\t-0.3\tein ▁Hund\nD-1\t-0.3\tein ▁Hund\nH-0\t-0.1\t▁Ein\n"
    assert recipe.read_hypotheses(out, 2) == ["▁Ein", "ein ▁Hund"]
    with pytest.raises(ValueError, match="no hypothesis for 1 of 3 sentences"):
        recipe.read_hypotheses(out, 3)


def test_peer_recipe_curve_takes_epoch_checkpoints_at_each_multiple_of_its_spacing(tmp_path):
    recipe = _load("bench_peer_recipe")
    log = "".join(
        f"2026-11-28 | INFO | fairseq.checkpoint_utils | Saved checkpoint {tmp_path}/"
        f"checkpoint{e}.pt (epoch {e} @ {67 * e} updates, score 4.1) (writing took 0.1 s)\n"
        for e in range(1, 21)
    )
    updates_at = recipe.epoch_updates(log)
    assert updates_at[8] == 536 and len(updates_at) == 20
    by_epoch = [(e, tmp_path / f"checkpoint{e}.pt") for e in range(11, 21)]  # the last 10 kept
    curve = recipe.curve_checkpoints(by_epoch, updates_at, 500)
    # 737 is the first past 500 kept here; 1,005 past 1,000; the last epoch always
    assert [u for u, _ in curve] == [737, 1005, 1340]
    assert curve[-1][1].name == "checkpoint20.pt"
    assert recipe.curve_checkpoints(by_epoch, updates_at, 100)[:2] == [
        (737, by_epoch[0][1]), (804, by_epoch[1][1])]  # fmt: skip


def test_peer_recipe_trains_wu_et_als_post_ln_shape_with_the_updates_of_two_gpus(tmp_path):
    recipe = _load("bench_peer_recipe")
    from types import SimpleNamespace

    args = SimpleNamespace(update_freq=2, max_update=8000, every_updates=500, seed=1)
    argv = recipe.fairseq_train_args(args, tmp_path / "bin", tmp_path / "ckpt", "en", "de")
    for side in ("encoder", "decoder"):
        assert argv[argv.index(f"--{side}-layers") + 1] == "4"
        assert argv[argv.index(f"--{side}-embed-dim") + 1] == "128"
        assert argv[argv.index(f"--{side}-ffn-embed-dim") + 1] == "256"
        assert f"--{side}-normalize-before" not in argv  # post-LN, fairseq's default
    assert "--share-all-embeddings" in argv
    # no mid-epoch saves: fairseq would validate there and count it toward --patience
    assert "--save-interval-updates" not in argv
    assert argv[argv.index("--keep-last-epochs") + 1] == "-1"
    assert [argv[argv.index(k) + 1] for k in ("--update-freq", "--max-tokens", "--lr")] == [
        "2", "4096", "0.005"]  # fmt: skip


def test_peer_recipe_decodes_every_sentence_with_wu_et_als_beam(tmp_path):
    """fairseq 0.12 drops a last batch whose size is not a multiple of
    --required-batch-size-multiple (8 by default): the evaluation asks for 1."""
    recipe = _load("bench_peer_recipe")
    argv = recipe.fairseq_generate_args(tmp_path / "bin", tmp_path / "m.pt", "valid", "en", "de")
    value = {k: argv[argv.index(k) + 1] for k in ("--required-batch-size-multiple", "--beam",
                                                  "--lenpen", "--gen-subset")}  # fmt: skip
    assert value == {"--required-batch-size-multiple": "1", "--beam": "5", "--lenpen": "1.0",
                     "--gen-subset": "valid"}  # fmt: skip


def test_a_peers_pieces_decode_to_our_text_and_unknown_pieces_are_counted(tmp_path):
    """``PieceCodec``: what a peer reads (our ids as piece names) and what it writes back go
    through our SentencePiece model unchanged; a piece we do not have is dropped and counted."""
    import sentencepiece as spm

    peers = _load("bench_peer_training")
    text = tmp_path / "t.txt"
    text.write_text("".join(f"ein Hund läuft über {i} Wiesen\n" for i in range(300)), "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "m"), vocab_size=60, minloglevel=2,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
    )  # fmt: skip
    codec = peers.PieceCodec(tmp_path / "m.model")
    line = "ein Hund läuft über 17 Wiesen"
    pieces = codec.encode(line)
    assert pieces.split() and all(p in codec.ids for p in pieces.split())
    assert codec.decode(pieces) == line and codec.unknown == 0
    assert codec.decode(f"{pieces} ▁nichtda") == line and codec.unknown == 1


def test_ours_from_an_earlier_run_needs_its_settings_for_our_side(tmp_path):
    """``--ours-from``: the fairseq part of ``make bench`` reports the runs of ours that the
    eole part trained, only when those were trained as this run would train them."""
    import argparse
    import json

    peers = _load("bench_peer_training")
    args = argparse.Namespace(steps=100, log_every=25, max_tokens=4096, threads=2, pad_multiple=1,
                              precision="fp32", ours_relu_dropout=0.0, warmup=100, lr_scale=0.5,
                              runs=2)  # fmt: skip
    rows = [{"run": i, "tgt_tokens_per_s": 3500.0 + i} for i in range(3)]
    settings = {k: getattr(args, k) for k in peers.OURS_SETTINGS} | {"peer": "eole"}
    earlier = tmp_path / "peer_fp32.json"
    earlier.write_text(json.dumps({"settings": settings, "runs": {"ours": rows}}), "utf-8")
    assert peers.reused_ours_runs(earlier, args) == rows[:2]

    other = argparse.Namespace(**{**vars(args), "precision": "bf16"})
    with pytest.raises(SystemExit, match="its precision is 'fp32', this run's is 'bf16'"):
        peers.reused_ours_runs(earlier, other)
    with pytest.raises(SystemExit, match="3 of our runs, --runs is 4"):
        peers.reused_ours_runs(earlier, argparse.Namespace(**{**vars(args), "runs": 4}))
    earlier.write_text("{}", "utf-8")
    with pytest.raises(SystemExit, match="not an output of bench_peer_training.py"):
        peers.reused_ours_runs(earlier, args)


def _screen_run(runs: Path, name: str, k1: float, chosen: float, ppl: float) -> None:
    run = runs / name
    run.mkdir(parents=True)
    (run / "average_selection.json").write_text(json.dumps({"best_k": 1, "dev_bleu": {"1": k1}}))
    (run / "alpha_selection.json").write_text(
        json.dumps({"best_alpha": 1.2, "dev_bleu": {"0.6": k1, "1.2": chosen}})
    )
    (run / "train_summary.json").write_text(json.dumps({"metrics": {"val/ppl": ppl}}))


def test_lever_screen_builds_each_variant_from_the_recipe_with_seeds(tmp_path):
    screen = _load("lever_screen")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "data_mirror: null\ndata: {multi30k: {en-de: {vocab_size: 8000}}}\n"
        "experiments:\n  cpu:\n    seeds: [9]\n    model_overrides: {norm_first: true}\n"
        "    train: {accelerator: cpu, by_precision: {bf16-mixed: {max_steps: 9500}}}\n"
    )
    out = tmp_path / "screen.yaml"
    screen.main([
        "config", "--recipe", str(recipe), "--seeds", "1", "2",
        "--variant", "postln", "model_overrides.norm_first=false",
        "--variant", "longer", "train.by_precision.bf16-mixed.max_steps=11400",
        "--set", "train.accelerator=gpu", "--data-mirror", "/m", "--out", str(out),
    ])  # fmt: skip
    config = yaml.safe_load(out.read_text())
    assert config["data_mirror"] == "/m"
    assert config["data"] == {"multi30k": {"en-de": {"vocab_size": 8000}}}
    exps = config["experiments"]
    assert list(exps) == ["cpu", "cpu_postln", "cpu_longer"]
    assert [e["seeds"] for e in exps.values()] == [[1, 2]] * 3
    assert [e["model_overrides"]["norm_first"] for e in exps.values()] == [True, False, True]
    assert [e["train"]["by_precision"]["bf16-mixed"]["max_steps"] for e in exps.values()] == [
        9500, 9500, 11400,
    ]  # fmt: skip
    assert {e["train"]["accelerator"] for e in exps.values()} == {"gpu"}
    targets = (tmp_path / "screen.yaml.targets").read_text().split()
    assert targets[0] == "results/runs/cpu.seed1/alpha_selection.json" and len(targets) == 6
    with pytest.raises(SystemExit, match="not key=value"):
        screen.main(["config", "--recipe", str(recipe), "--set", "train", "--out", str(out)])
    # a data lever: the config's own keys, the recipe's experiment renamed, no other variant
    screen.main([
        "config", "--recipe", str(recipe), "--seeds", "3", "--name", "cpu_lc10k",
        "--config-set", "data.multi30k.en-de.vocab_size=10000",
        "data.multi30k.en-de.lowercase=true",
        "--out", str(out),
    ])  # fmt: skip
    config = yaml.safe_load(out.read_text())
    assert config["data"] == {"multi30k": {"en-de": {"vocab_size": 10000, "lowercase": True}}}
    assert list(config["experiments"]) == ["cpu_lc10k"]
    assert config["experiments"]["cpu_lc10k"]["model_overrides"] == {"norm_first": True}
    assert (tmp_path / "screen.yaml.targets").read_text().split() == [
        "results/runs/cpu_lc10k.seed3/alpha_selection.json"
    ]
    with pytest.raises(SystemExit, match="an experiment's key"):
        screen.main([
            "config", "--recipe", str(recipe), "--config-set", "experiments.cpu.seeds=[1]",
            "--out", str(out),
        ])  # fmt: skip


def test_lever_screen_adopts_only_above_the_larger_sd_on_both_dev_measures(tmp_path):
    screen = _load("lever_screen")
    runs = tmp_path / "runs"
    config = {"experiments": {name: {"seeds": [1, 2, 3]} for name in ("base", "up", "half")}}
    for seed, (k1, chosen) in enumerate([(40.0, 40.5), (40.2, 40.7), (40.4, 40.9)], start=1):
        _screen_run(runs, f"base.seed{seed}", k1, chosen, 5.0)
        _screen_run(runs, f"up.seed{seed}", k1 + 0.5, chosen + 0.5, 4.8)  # gain 0.5 > sd 0.2
        _screen_run(runs, f"half.seed{seed}", k1 + 0.5, chosen + 0.1, 4.8)  # chosen: 0.1 < 0.2
    result = screen.summarize(config, runs)
    base = result["variants"]["base"]["stats"]
    assert base["dev_bleu_k1"]["mean"] == pytest.approx(40.2)
    assert base["dev_bleu_k1"]["sd"] == pytest.approx(0.2)
    assert base["dev_ppl"]["mean"] == pytest.approx(5.0)  # the last validation's, from the summary
    up, half = result["variants"]["up"], result["variants"]["half"]
    assert up["rule"]["dev_bleu_k1"]["gain"] == pytest.approx(0.5) and up["adopt"]
    assert half["rule"]["dev_bleu_k1"]["above"] and not half["rule"]["dev_bleu_chosen"]["above"]
    assert not half["adopt"]
    # a run that did not finish leaves its variant undecided, never adopted
    (runs / "up.seed3" / "alpha_selection.json").unlink()
    assert not screen.summarize(config, runs)["variants"]["up"]["adopt"]


def test_lever_screen_summarises_the_test_scores_where_the_runs_have_them(tmp_path):
    screen = _load("lever_screen")
    runs = tmp_path / "runs"
    config = {"experiments": {"gpu": {"seeds": [1, 2]}}}
    for seed, bleu in ((1, 40.0), (2, 41.0)):
        _screen_run(runs, f"gpu.seed{seed}", 41.0, 41.5, 5.0)
        scores = {"bleu": {"score": bleu - 0.5}, "bleu_lc_tok": {"score": bleu}}
        (runs / f"gpu.seed{seed}" / "test_2016_flickr.scores.json").write_text(json.dumps(scores))
    result = screen.summarize(config, runs)
    variant = result["variants"]["gpu"]
    assert variant["runs"][2]["test"]["test_2016_flickr"] == {"bleu": 40.5, "bleu_lc_tok": 41.0}
    lc_tok = variant["test"]["test_2016_flickr.bleu_lc_tok"]
    assert lc_tok["mean"] == pytest.approx(40.5) and lc_tok["n"] == 2
    assert lc_tok["sd"] == pytest.approx(0.7071, abs=1e-4)
    assert "| gpu | 40.00 ± 0.71 (n 2) | 40.50 ± 0.71 (n 2) |" in screen.render(result)
    (runs / "gpu.seed2" / "test_2016_flickr.scores.json").unlink()  # not decoded: left out
    assert screen.summarize(config, runs)["variants"]["gpu"]["test"][
        "test_2016_flickr.bleu_lc_tok"]["n"] == 1  # fmt: skip
