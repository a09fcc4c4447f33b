# copier: everything is installed into .venv/ at the repository root.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= test,lint,spark,bench

.PHONY: install test test-fast demo lint chaos bench clean

install: $(STAMP)

# amazon-kclpy is an sdist whose build downloads the KCL MultiLangDaemon jars
# from Maven Central (KCL_MVN_REPO_SEARCH_URL overrides the base URL); the
# last line checks that they arrived.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m copier.jars --check
	touch $@

test: install
	$(BIN)/python -m pytest

demo: install
	$(BIN)/copier demo

test-fast: install
	$(BIN)/python -m pytest -m "not protocol"

# The fault-injection suite: SEEDS seeds of the real pipeline under faults (a few minutes each).
SEEDS ?= 50
chaos: install
	$(BIN)/python -m copier.chaos --seeds $(SEEDS) --report docs/reliability.md --json docs/reliability.json

# Benchmarks against baselines in one run: docs/benchmarks.md, .json and PNG plots (about half an hour).
bench: install
	$(BIN)/python -m copier.bench --out docs

lint: install
	$(BIN)/ruff check copier tests
	$(BIN)/mypy copier

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
