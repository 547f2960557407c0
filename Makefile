# Two entry points: `make optimize` (the main job) and `make test` (the test suite).
# Each creates .venv on first use. The CPU set-up pins torch==2.13.0 (a CPU build; a plain
# `torch` would pull a multi-GB CUDA build), triton==3.6.0 (as on the H200) and numpy<2.3 (newer numpy breaks Triton's CPU
# interpreter). On a GPU machine, install torch your usual way, then `pip install -e .`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROBLEM ?= kda
BUDGET ?= 40

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0" "triton==3.6.0" "numpy<2.3" -e .
	touch $@

install: $(BIN)/.installed

optimize: $(BIN)/.installed
	$(BIN)/pytest --kopt-optimize=$(PROBLEM) --kopt-budget=$(BUDGET)

test: $(BIN)/.installed
	$(BIN)/pytest

.PHONY: install optimize test
