# Two entry points: `make optimize` (the main job) and `make test` (the test suite); the common
# commands after them are targets too (resume, report, compare, problems). Each creates .venv on
# first use. The CPU set-up pins torch==2.13.0 (a CPU build; a plain `torch` would pull a multi-GB
# CUDA build), triton==3.6.0 (as on the H200) and numpy<2.3 (newer numpy breaks Triton's CPU
# interpreter). Where pip would resolve torch to the CUDA build (a machine with internet and no
# local wheel), name PyTorch's CPU wheel index: `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
# On a GPU machine, install torch your usual way, then `pip install -e .`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROBLEM ?= kda
BUDGET ?= 40
MORE ?= 40
RUN ?=
TORCH_INDEX ?=

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) )"torch==2.13.0"
	$(BIN)/pip install --quiet "torch==2.13.0" "triton==3.6.0" "numpy<2.3" -e .
	touch $@

# the test extra: Ray for the executor's tests (~15 s; a wheel of ~70 MB) and pytest-xdist
$(BIN)/.test-installed: $(BIN)/.installed
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

install: $(BIN)/.installed

optimize: $(BIN)/.installed
	$(BIN)/pytest --kopt-optimize=$(PROBLEM) --kopt-budget=$(BUDGET)

# one pytest worker per core (at most 4), each taking whole test files (module fixtures such as the
# hostile candidates' verdicts or a local Ray instance are built once)
test: $(BIN)/.installed $(BIN)/.test-installed
	$(BIN)/pytest -n auto --maxprocesses=4 --dist loadfile

# make resume RUN=results/local/kda-<stamp> [MORE=40]: MORE tool calls on top of what the run has used
resume: $(BIN)/.installed
	@test -n "$(RUN)" || { echo "make resume: name the run, e.g. make resume RUN=results/local/$(PROBLEM)-<stamp>"; exit 2; }
	$(BIN)/pytest --kopt-optimize=$(PROBLEM) --kopt-resume --kopt-run-dir=$(RUN) --kopt-budget=+$(MORE)

report: $(BIN)/.installed
	@test -n "$(RUN)" || { echo "make report: name the run(s), e.g. make report RUN=results/runs/kda-h200-2"; exit 2; }
	$(BIN)/kopt report $(RUN) --out results/local/reports

compare: $(BIN)/.installed
	$(BIN)/kopt compare $(or $(RUN),results/h200-2026-11-30m/call4 results/h200-2026-11-30n/call3)

problems: $(BIN)/.installed
	$(BIN)/kopt problems

.PHONY: install optimize test resume report compare problems
