# Two commands on a fresh machine (README.md, "Quick start"):
#   make run     # set up .venv on first use, then: snakemake --cores all $(ARGS)
#   make test    # set up .venv on first use, then: python -m pytest -q, one worker per core
# make test-fast: the same without the tests marked slow (whole DAGs, clusters, training runs)
# make test-gpu: the tests marked gpu alone, cut at a time limit (below)
# e.g. make run ARGS="--config data_mirror=../shared/data"
# VENV picks the virtual environment (CI: VENV=.venv-ci); TORCH_INDEX an index for torch, e.g.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU-only build on Linux (PyPI's
# Linux wheels carry CUDA, several GB).

VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
ARGS ?=
PYTHON3 ?= python3

BIN := $(abspath $(VENV))/bin
# Snakemake's jobs call `python -m transformer_nmt`: the venv's python must come first.
export PATH := $(BIN):$(PATH)

.PHONY: install run test test-fast test-gpu lint format ui check-config bench
.DEFAULT_GOAL := run

# torch first, pinned, so that installing the package does not pull another build of it
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON3) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[test,ct2]'
	touch $@

install: $(VENV)/.installed

run: install
	snakemake --cores all $(ARGS)

# pytest-xdist: one worker per core, each test file whole on one worker (its module-scoped
# fixtures, e.g. a whole DAG, built once), in the order tests/conftest.py gives (the longest
# first); TEST_WORKERS=0 runs in this process
TEST_WORKERS ?= auto
PYTEST := python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: install
	$(PYTEST)

test-fast: install
	$(PYTEST) -m "not slow"

# make test-gpu: the tests marked gpu alone, in one process (no xdist workers, each with a pool of
# inductor compile workers: such a run hung on an H100), inductor compiling in that process, the
# whole run cut at GPU_TEST_LIMIT seconds; without CUDA every one is skipped. No install step: it
# runs the python on PATH after the venv's, so a GPU machine's own environment serves too
GPU_TEST_LIMIT ?= 300
test-gpu:
	TORCHINDUCTOR_COMPILE_THREADS=1 timeout -s INT -k 15 $(GPU_TEST_LIMIT) \
		python -m pytest -q -p no:xdist -m gpu $(ARGS)

# a config's YAML syntax (file:line:column) and keys, e.g. make check-config CONFIG=my.yaml
CONFIG ?= config/config.yaml
check-config: install
	python -m transformer_nmt check-config $(CONFIG)

# the MLflow UI on mlflow.db, with each experiment's link to its runs
ui: install
	python -m transformer_nmt ui $(ARGS)

# the quick set of benchmarks (record make_bench_<cpu class> has its minutes), rewriting
# benchmarks/records/ and the tables of README.md and docs/ (benchmarks/render_tables.py); it
# lists the config/ figures that no longer match. make bench ARGS="--mirror ../shared/data"
bench: install
	python benchmarks/bench_quick.py $(ARGS)

# Python (ruff), Snakemake files (snakefmt, snakemake --lint)
lint: install
	ruff check .
	ruff format --check .
	snakefmt --check Snakefile workflow/
	snakemake --lint --cores 1

format: install
	ruff format .
	ruff check --fix .
	snakefmt Snakefile workflow/
