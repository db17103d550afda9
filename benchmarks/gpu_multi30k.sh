#!/usr/bin/env bash
# The Multi30k GPU recipe on one lent GPU, as one script: each step has its own time limit, writes
# its figures under OUT, and a failing step does not stop the next. Steps, most valuable first:
#   a. config/experiments/multi30k_en_de_base.yaml with seeds 1-3 (SEEDS) side by side on the one
#      GPU: the whole DAG through snakemake (profiles/default, --cores all: the three train jobs
#      at once, each a host-bound process) to the test scores. OUT/multi30k.json: dev BLEU (K 1 and
#      alpha 0.6; after the choice of K and alpha) and test BLEU (sacreBLEU, lowercased tokenized)
#      per seed, their mean and sd, the DAG's seconds (the sum over the calls it took)
#   b. WMT14's big (config/experiments/wmt14_en_de_big.yaml's model and train keys: max_tokens
#      auto, 25k tokens per update, bf16) on a's Multi30k data, the real train stage for B_STEPS
#      updates (benchmarks/bench_train_memory.py), train.fused_loss auto against false.
#      OUT/fused_loss.json: peak GPU memory, target tokens/s and the loss's path per setting
#   c. make test-gpu: the gpu-marked tests, one process, one inductor compile thread
#      (OUT/tests_gpu.log)
# OUT also gets run.log (this script's output) and dag.tgz (a's logs and small files).
#
# One call runs at most 10 minutes, and a's DAG takes about that on an H200 (the same settings'
# three seeds took ~9 minutes to the dev set's choices, then ~1 to the test scores): two calls
# on the same machine, the second within its 30 s of warmth (a's directory, /tmp/gpu_multi30k,
# lives on the machine):
#   STEPS=a bash benchmarks/gpu_multi30k.sh                  # a, stopped at A_LIMIT (540 s);
#                                                            # its train jobs save a checkpoint
#   STEPS="a b c" A_RESUME_ONLY=1 bash benchmarks/gpu_multi30k.sh   # a resumed and ended, b, c
# A_RESUME_ONLY=1: a only where its directory is there (a fresh machine goes on to b and c, whose
# data the pipeline then builds first). Limits: A_LIMIT 540 (the first call's ~20 s of setup
# around it), B_LIMIT 150 (B_STEPS 100), C_LIMIT 120 seconds: the second call ~1 minute of a's
# test sets, then at most 4.5 minutes. Needs .gpu_carry/ (benchmarks/gpu_carry.sh: the carried
# packages, the Multi30k mirror).
#   GPU_MULTI30K_DRY=1 bash benchmarks/gpu_multi30k.sh   # on a CPU: every step tiny (a slice of
#                                                        # Multi30k, a tiny model, 20 updates)
set -u
DRY=${GPU_MULTI30K_DRY:-0}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/benchmarks/out/gpu_multi30k}
mkdir -p "$OUT"
START=$(date +%s)
exec > >(tee -a "$OUT/run.log") 2>&1

STEPS=${STEPS:-a b c}
SEEDS=${SEEDS:-1 2 3}
DAG=${GPU_MULTI30K_DIR:-/tmp/gpu_multi30k}  # a's working directory, kept between calls
EXPERIMENT=multi30k_en_de_base
wants() { [[ " $STEPS " == *" $1 "* ]]; }
STEPS_LOG=/tmp/gpu_multi30k_steps.txt LOCAL=$DRY
source "$REPO/benchmarks/gpu_env.sh"
MIRROR=${GPU_MULTI30K_MIRROR:-$CARRY/mirror}

# the DAG's config: the recipe with its seeds (benchmarks/lever_screen.py config), the data from
# the mirror; a dry run a tiny model on a slice of Multi30k on the CPU
dag_config() {
    local dry_train=() dry_data=()
    if [ "$DRY" = 1 ]; then
        dry_train=(--set train.accelerator=cpu train.precision=32-true train.max_steps=20
            train.warmup=5 train.lr_cooldown_steps=5 train.max_tokens=1024
            train.tokens_per_update=1024 train.checkpoint_every_steps=1 train.val_every_steps=10
            train.val_beam_bleu_every_steps=20 train.log_every_steps=5 model_overrides.N=1
            model_overrides.d_model=64 model_overrides.d_ff=128 model_overrides.h=2
            translate.beam=2 translate.max_len_b=5)
        dry_data=(--config-set data.multi30k.en-de.vocab_size=600
            data.multi30k.en-de.clean.max_sentences=150)
    fi
    python benchmarks/lever_screen.py config --recipe "config/experiments/$EXPERIMENT.yaml" \
        --seeds $SEEDS --data-mirror "$MIRROR" "${dry_train[@]}" "${dry_data[@]}" \
        --out "$DAG/config.yaml"
    # the SQLite store made once, before several jobs open it at the same moment
    (cd "$DAG" && python -c "import mlflow; mlflow.set_tracking_uri('sqlite:///$DAG/mlflow.db')
mlflow.search_experiments()" > /dev/null 2>&1)
}
# snakemake on the DAG's config in its directory
DAG_RUN=(snakemake -d "$DAG" -s "$REPO/Snakefile" --profile "$REPO/profiles/default" --cores all
    --configfile "$DAG/config.yaml")

# --- a. the recipe, 3 seeds side by side, the whole DAG ----------------------------------------
if wants a; then
if [ "${A_RESUME_ONLY:-0}" = 1 ] && [ ! -f "$DAG/config.yaml" ]; then
    say "a: no DAG in $DAG to resume (a fresh machine): left out"
else
    if [ -f "$DAG/config.yaml" ]; then
        say "a: resuming the DAG in $DAG"
    else
        rm -rf "$DAG" && mkdir -p "$DAG" && dag_config
    fi
    t0=$(date +%s)
    step dag "${A_LIMIT:-$([ "$DRY" = 1 ] && echo 900 || echo 540)}" "${DAG_RUN[@]}" \
        >> "$DAG/dag.log" 2>&1
    echo "$(( $(date +%s) - t0 )) $(tail -n 1 "$STEPS_LOG")" >> "$DAG/dag_seconds.txt"
    tail -n 12 "$DAG/dag.log"
    python benchmarks/lever_screen.py summary --config "$DAG/config.yaml" \
        --runs-dir "$DAG/results/runs" --out "$DAG/summary.json"
    # the summary, each seed's numbers and the DAG's seconds in one JSON
    python - "$DAG" "$OUT/multi30k.json" "$EXPERIMENT" <<'PYTHON'
import json, sys
from pathlib import Path
dag, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
summary = json.loads((dag / "summary.json").read_text())
calls = [line.split(maxsplit=1) for line in (dag / "dag_seconds.txt").read_text().splitlines()]
variant = summary["variants"][name]
seeds = variant["runs"]
complete = all(len(run["test"]) == 2 for run in seeds.values())
seconds = sum(int(s) for s, _ in calls)
lc_tok = variant["test"].get("test_2016_flickr.bleu_lc_tok", {}).get("mean")
result = {
    "recipe": f"config/experiments/{name}.yaml", "seeds": list(seeds), "complete": complete,
    "dag_seconds": seconds, "dag_minutes": seconds / 60,
    "calls": [{"seconds": int(s), "status": status} for s, status in calls],
    "dev": variant["stats"], "test": variant["test"], "runs": seeds,
    "goal": {"test_2016_flickr_lc_tok_mean": lc_tok, "at_least": 41.0, "dag_minutes_at_most": 10,
             "met": bool(complete and lc_tok is not None and lc_tok >= 41.0 and seconds <= 600)},
    "machine": summary["machine"],
}
out.write_text(json.dumps(result, indent=1) + "\n")
print(f"a: {len(seeds)} seeds, complete: {complete}, DAG {seconds / 60:.1f} minutes; "
      f"test_2016_flickr lowercased tokenized mean {lc_tok}")
PYTHON
    (cd "$DAG" && tar czf "$OUT/dag.tgz" --exclude='*.ckpt' --exclude='*.pt' --exclude='*.bin' \
        --exclude='*.idx' --exclude='*.npy' config.yaml dag.log dag_seconds.txt summary.json \
        results/runs logs .snakemake/log 2>/dev/null)
fi
fi

# --- b. WMT14's big through the train stage: the fused loss against the eager one -------------
if wants b; then
[ -f "$DAG/config.yaml" ] || { mkdir -p "$DAG" && dag_config; }
# the data and the runs' train_config.json (a's, or built now where a did not run)
step b_data 120 "${DAG_RUN[@]}" --until encode train_config >> "$DAG/dag.log" 2>&1
if [ "$DRY" = 1 ]; then
    COMMON=(train.accelerator=cpu train.precision=32-true train.devices=1 train.num_workers=0
        train.max_tokens=512 train.tokens_per_update=512 train.val_bleu_sentences=0
        train.log_every_steps=2 model.preset=tiny model.overrides.N=1 model.overrides.d_model=64
        model.overrides.d_ff=128 model.overrides.h=2 model.overrides.d_k=32 model.overrides.d_v=32)
    B_STEPS=${B_STEPS:-4}
else
    # the end's validation without its 500 greedy sentences: the train step is what is measured
    COMMON=(train.devices=1 train.log_every_steps=10 train.val_bleu_sentences=0)
    B_STEPS=${B_STEPS:-100}
fi
step b_fused_loss "${B_LIMIT:-$([ "$DRY" = 1 ] && echo 300 || echo 150)}" \
    python benchmarks/bench_train_memory.py --workdir "$DAG" --config "$DAG/config.yaml" \
    --experiment "$EXPERIMENT" --settings-from config/experiments/wmt14_en_de_big.yaml \
    --steps "$B_STEPS" --common "${COMMON[@]}" --set train.fused_loss=auto \
    --set train.fused_loss=false --out "$OUT/fused_loss.json"
fi

# --- c. the gpu-marked tests ---------------------------------------------------------------------
if wants c; then
    C_LIMIT=${C_LIMIT:-120}
    if command -v make > /dev/null; then
        step c_tests_gpu $(( C_LIMIT + 30 )) make test-gpu GPU_TEST_LIMIT="$C_LIMIT" \
            > "$OUT/tests_gpu.log" 2>&1
    else  # the same command as the Makefile's test-gpu
        TORCHINDUCTOR_COMPILE_THREADS=1 step c_tests_gpu "$C_LIMIT" python -m pytest -q \
            -p no:xdist -m gpu > "$OUT/tests_gpu.log" 2>&1
    fi
    tail -n 12 "$OUT/tests_gpu.log"
fi
say "done"
cat "$STEPS_LOG" 2> /dev/null
