#!/usr/bin/env bash
# The peer toolkit eole (successor of OpenNMT-py) in its own virtual environment, for
# benchmarks/bench_peer_*.py only: never a dependency of the project.
# torch stays the CPU build 2.13.0 (the machine's local wheel) through a constraints file:
# an unpinned torch would pull the newest CUDA build with several GB of CUDA packages.
# Usage: bash benchmarks/peers/install_eole.sh [PYTHON]   (default: python3.11)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/../.venv-peer-eole"
python="${1:-python3.11}"
"$python" -m venv "$venv"
"$venv/bin/pip" install torch==2.13.0
"$venv/bin/pip" install -c "$here/constraints-torch.txt" -r "$here/requirements-eole.txt"
"$venv/bin/eole" --help > /dev/null
echo "eole installed in $venv"
