# Sourced by the GPU scripts (benchmarks/gpu_proof.sh, benchmarks/gpu_multi30k.sh): the GPU
# machine's environment and the steps' time limits. Before sourcing, the script sets REPO (the
# checkout), START (its start, date +%s), STEPS_LOG (a file: one status line per step) and LOCAL
# (1 on a CPU check of the script: this machine's packages, not the carried ones).
# Sets CARRY (.gpu_carry/, built by benchmarks/gpu_carry.sh: site.tgz, mirror/, demo/, commit),
# PYTHONPATH (the carried packages, then src/), PATH (python, snakemake and mlflow wrappers
# first, in /tmp/gpubin), TRANSFORMER_NMT_TEST_MIRROR; prints the machine and the packages.
# Defines say MESSAGE and step NAME LIMIT_S COMMAND... (a time limit, its status logged; a failing
# step never stops the script).
CARRY=$REPO/.gpu_carry
rm -f "$STEPS_LOG"
say() { echo "== [$(( $(date +%s) - START )) s] $*"; }
step() {
    local name=$1 limit=$2
    shift 2
    say "$name (limit ${limit}s): $*"
    local t0=$(date +%s)
    timeout -s INT -k 10 "$limit" "$@"
    local rc=$?
    say "$name: rc=$rc in $(( $(date +%s) - t0 )) s"
    echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" >> "$STEPS_LOG"
}

if [ -f "$CARRY/site.tgz" ] && [ "$LOCAL" = 0 ]; then
    tar xzf "$CARRY/site.tgz" -C /tmp && export PYTHONPATH=/tmp/gpusite:$REPO/src
else
    export PYTHONPATH=$REPO/src
fi
rm -rf /tmp/gpubin && mkdir -p /tmp/gpubin  # fresh files: never write through an old link
PY=
for candidate in python python3; do  # the interpreter that has torch
    command -v $candidate > /dev/null && $candidate -c "import torch" 2> /dev/null &&
        PY=$(command -v $candidate) && break
done
# wrappers, not links: a link to a virtual environment's python loses the environment
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > /tmp/gpubin/python
printf '#!/bin/sh\nexec %s -m snakemake "$@"\n' "$PY" > /tmp/gpubin/snakemake
printf '#!/bin/sh\nexec %s -m mlflow "$@"\n' "$PY" > /tmp/gpubin/mlflow
chmod +x /tmp/gpubin/python /tmp/gpubin/snakemake /tmp/gpubin/mlflow
export PATH=/tmp/gpubin:$PATH PYTHONUNBUFFERED=1
export TRANSFORMER_NMT_TEST_MIRROR=$CARRY/mirror
{
    echo "commit: $(cat "$CARRY/commit" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
    date -u
    nvidia-smi 2>&1 | head -15
    lscpu | grep -E 'Model name|^CPU\(s\)'
    python -c "import torch, lightning, snakemake, mlflow, sentencepiece, sacrebleu, sys
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'lightning', lightning.__version__, 'snakemake', snakemake.__version__,
      'mlflow', mlflow.__version__, 'sacrebleu', sacrebleu.__version__)
print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
} 2>&1
