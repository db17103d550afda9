#!/usr/bin/env bash
# Builds .gpu_carry/ (git-ignored), what the GPU scripts (benchmarks/gpu_proof.sh,
# benchmarks/gpu_multi30k.sh) need on the GPU machine beside this checkout, which that machine
# (Python 3.12, torch, Lightning, sentencepiece, sacrebleu; no package registry) lacks:
#   site.tgz  snakemake, MLflow and the rest of this venv's packages that the machine's image does
#             not have, as cp312 wheels unpacked into gpusite/ (MLflow's UI bundle and PuLP's CBC
#             binaries left out: no UI is served there and snakemake falls back to its greedy
#             scheduler), ~23 MB
#   mirror/   the Multi30k raw files (data_mirror)   demo/  a trained model for gpu_proof's step 4
#   commit    this checkout's commit
#   bash benchmarks/gpu_carry.sh MIRROR_DIR [DEMO_RESULTS_DIR]
#     e.g. bash benchmarks/gpu_carry.sh ../shared/data results   (results/: a finished demo run;
#     without it, no fallback model: step 4 then needs step 3's)
# Then, with the device tool: run  OUT=$OUT bash benchmarks/gpu_proof.sh  (or gpu_multi30k.sh)
# carrying .gpu_carry.
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=${1:?the data mirror holding multi30k/}
DEMO=${2:-}  # a results/ folder with runs/multi30k_en_de_tiny/averaged.pt, or none
VENV=${VENV:-.venv}
CARRY=.gpu_carry
grep -qx '/.gpu_carry/' .git/info/exclude 2>/dev/null || echo '/.gpu_carry/' >> .git/info/exclude
rm -rf "$CARRY" /tmp/gpu_carry_wheels /tmp/gpusite && mkdir -p "$CARRY/demo" /tmp/gpu_carry_wheels
# The machine image's packages (the device tool's KINDS.md, "Python packages already there",
# as read on 2026-11-17).
ON_IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"
LINT_ONLY="black ruff snakefmt shfmt-py pytokens ctranslate2"
normal() { tr 'A-Z_.' 'a-z--'; }
skip=$(echo $ON_IMAGE $LINT_ONLY | tr ' ' '\n' | normal)
"$VENV/bin/pip" list --format=freeze --exclude-editable | while IFS='=' read -r name _ version; do
    echo "$skip" | grep -qx "$(echo "$name" | normal)" || echo "$name==$version"
done > /tmp/gpu_carry_wheels/wanted.txt
while read -r pin; do  # one at a time: a package with no cp312 wheel is taken from the venv
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d /tmp/gpu_carry_wheels "$pin" > /dev/null 2>&1 || echo "${pin%%==*}" >> /tmp/gpu_carry_wheels/from_venv.txt
done < /tmp/gpu_carry_wheels/wanted.txt
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --target /tmp/gpusite /tmp/gpu_carry_wheels/*.whl
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
touch /tmp/gpu_carry_wheels/from_venv.txt
while read -r name; do  # pure-Python packages only have sdists (connection_pool)
    module=$(echo "$name" | tr 'A-Z-' 'a-z_')
    cp -r "$SITE/$module" "$SITE/$module"-*.dist-info /tmp/gpusite/ 2> /dev/null ||
        echo "warning: $name is neither a cp312 wheel nor in $SITE"
done < /tmp/gpu_carry_wheels/from_venv.txt
rm -rf /tmp/gpusite/pulp/solverdir/cbc /tmp/gpusite/mlflow/server/js/build
find /tmp/gpusite -name __pycache__ -prune -exec rm -rf {} +
tar czf "$CARRY/site.tgz" -C /tmp gpusite
mkdir -p "$CARRY/mirror" && cp -r "$MIRROR/multi30k" "$CARRY/mirror/"
if [ -n "$DEMO" ]; then
    cp "$DEMO/runs/multi30k_en_de_tiny/averaged.pt" "$DEMO/spm/multi30k/en-de/spm.model" \
        "$DEMO"/data/multi30k/en-de/test_2016_flickr.{en,de} "$CARRY/demo/"
else
    echo "no demo results given: no fallback model for gpu_proof.sh's step 4"
fi
git rev-parse --short HEAD > "$CARRY/commit"
du -sh "$CARRY"
