# The two commands: `make demo` and `make test`. Each creates .venv if missing and
# installs what it needs. The first install compiles llama-cpp-python (~13 min on 2 cores);
# pip caches the wheel, so later installs take seconds.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sangama-installed
# Skip the multimodal library Sangama does not use. Installers build with
# -DGGML_NATIVE=OFF so the binaries run on other CPUs (see installers/README.md).
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: demo test lint venv clean bench

demo: $(STAMP)
	$(BIN)/sangama demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/engine.py

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
