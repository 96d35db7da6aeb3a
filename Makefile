# frugalrl: the two commands of the README.
#   make demo   install everything, then train PPO on LunarLander-v3 through ClusterEnv (local backend)
#   make test   install everything, then run the test suite
#   make docs   build the docs site into site/ (warnings are errors)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo test test-slow test-all lint docs bench clean headline headline-quick

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, from the CPU build (a bare `torch` would pull gigabytes of CUDA packages)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/frugalrl train ppo --env LunarLander-v3 --workers 2 --envs-per-worker 8 \
	    --num-steps 128 --num-minibatches 32 --update-epochs 4 --learning-rate 5e-4 \
	    --gamma 0.999 --gae-lambda 0.98 --ent-coef 0.01 --sync aaps --kl-threshold 0.05 \
	    --total-timesteps 1000000 --eval-every 20

test: install
	$(PY) -m pytest -q -m "not slow"

test-slow: install
	$(PY) -m pytest -q -m slow

test-all: install
	$(PY) -m pytest -q

# The README's headline table, every row re-measured on this commit with its reference (a few hours on 2 cores;
# rows already measured at this commit are kept): benchmarks/headline.py, docs/benchmarks.md#protocol.
headline: install
	$(PIP) install -q -e ".[suite,lda-bench]"
	$(PY) benchmarks/headline.py

# The same rows at tiny budgets, into benchmarks/results/headline/quick/ (not in git): does it run end to end.
headline-quick: install
	$(PIP) install -q -e ".[suite,lda-bench]"
	$(PY) benchmarks/headline.py --quick

lint: install
	$(VENV)/bin/ruff check src tests benchmarks examples docs
	$(VENV)/bin/mypy src

# The docs site into site/ (open site/index.html), warnings as errors; docs/hooks.py generates its benchmark
# tables from benchmarks/results/*.json and its config references from the config dataclasses.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site .pytest_cache
