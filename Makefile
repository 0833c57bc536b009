# The two commands: `make demo` and `make test`. Each creates .venv if missing and
# installs what it needs. The engine (llama-cpp-python with one CPU module per CPU
# generation, see docs/engine.md) is built once per machine into a cached wheelhouse
# (~25 min on 2 cores the first time); later installs take seconds.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sangama-installed
ENGINE := installers/engine/build_wheel.py
# GPU backends built into the engine wheel (Vulkan: any vendor, see docs/engine.md);
# ENGINE_GPU= builds a CPU-only wheel.
ENGINE_GPU ?= --gpu vulkan
# The Debian packages they need (installers/system-packages.txt, shared with .ci/run):
# installed when run as root, else named with the command to run, before anything builds.
PACKAGES := python3 installers/system_packages.py ensure engine $(if $(findstring vulkan,$(ENGINE_GPU)),vulkan)

.PHONY: demo test lint venv clean bench engine-wheel engine-wheel-cuda engine-native \
	system-packages

demo: system-packages $(STAMP)
	$(BIN)/sangama demo

test: system-packages $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest --durations=40

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/engine.py

venv: $(STAMP)

system-packages:
	@command -v python3 >/dev/null || { echo "missing Debian packages: python3 — run: sudo apt-get install python3"; exit 1; }
	@$(PACKAGES)

# The shipped engine: run-time CPU dispatch (+ ENGINE_GPU), cached by recipe digest.
engine-wheel: system-packages
	$(PYTHON) $(ENGINE) $(ENGINE_GPU)

# The CUDA engine for NVIDIA cards (hours on 2 cores; never part of `make test`).
engine-wheel-cuda:
	$(PYTHON) $(ENGINE) --gpu cuda

# A -march=native build in .venv-native, only for bench/engine.py's side-by-side figures.
engine-native: $(STAMP)
	$(PYTHON) $(ENGINE) --native
	test -x .venv-native/bin/python || $(PYTHON) -m venv .venv-native
	.venv-native/bin/python -m pip install --quiet --force-reinstall \
	    "$$($(PYTHON) $(ENGINE) --native --print-wheel)"
	.venv-native/bin/python -m pip install --quiet -e .

# The Debian package of the desktop app: Briefcase's `linux system` target with the
# project's own template (installers/README.md). Prints the .deb's path (in dist/).
.PHONY: installer-linux test-installer
installer-linux: $(STAMP)
	$(BIN)/python installers/linux/build.py \
	    --engine-wheel "$$($(PYTHON) $(ENGINE) $(ENGINE_GPU) --print-wheel)"

# That package installed into clean Debian 12 and 13 roots and used there (root; minutes).
test-installer: $(STAMP)
	$(BIN)/python -m pytest -m installer tests/installer

$(STAMP): pyproject.toml $(ENGINE) | system-packages
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	$(PYTHON) $(ENGINE) $(ENGINE_GPU)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps --force-reinstall \
	    "$$($(PYTHON) $(ENGINE) $(ENGINE_GPU) --print-wheel)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .venv-native .pytest_cache .mypy_cache .ruff_cache
