#!/usr/bin/env bash
# The peer toolkit fairseq in its own virtual environment, for benchmarks/bench_peer_*.py
# only: never a dependency of the project. torch stays the CPU build 2.13.0 (the machine's
# local wheel) through a constraints file, as in install_eole.sh. fairseq-fixed's sdist is
# built against that torch (C++ extensions and Cython, ~3 min on one core); torchaudio, a
# declared dependency used by fairseq's speech tasks only, is left out (--no-deps).
# Usage: bash benchmarks/peers/install_fairseq.sh [PYTHON]   (default: python3.11)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/../.venv-peer-fairseq"
python="${1:-python3.11}"
"$python" -m venv "$venv"
"$venv/bin/pip" install torch==2.13.0
"$venv/bin/pip" install -c "$here/constraints-torch.txt" -r "$here/requirements-fairseq.txt"
MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/pip" install --no-deps --no-build-isolation \
  -c "$here/constraints-torch.txt" fairseq-fixed==0.12.3.1
"$venv/bin/fairseq-train" --help > /dev/null
echo "fairseq installed in $venv"
