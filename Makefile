# copier: everything is installed into .venv/ at the repository root.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= test,lint,spark,bench

.PHONY: install test test-fast model-long demo lint chaos bench dist clean

# libfaketime puts chaos seeds' processors off AWS time (copier/chaos/clocks.py; Debian's faketime package),
# installed if missing: here rather than in $(STAMP)'s recipe, so that an existing .venv gets it too.
install: $(STAMP)
	command -v faketime >/dev/null 2>&1 || { sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q faketime; }

# amazon-kclpy is an sdist whose build downloads the KCL MultiLangDaemon jars
# from Maven Central (KCL_MVN_REPO_SEARCH_URL overrides the base URL); copier.kcl.jars
# --check checks that they arrived.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m copier.kcl.jars --check
	@# systemd-analyze checks the units in the tests (Debian's systemd package, installed if missing).
	command -v systemd-analyze >/dev/null 2>&1 || { sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q systemd; }
	touch $@

test: install
	$(BIN)/python -m pytest

demo: install
	$(BIN)/copier demo

test-fast: install
	$(BIN)/python -m pytest -m "not protocol"

# The exactly-once model (tests/test_exactly_once_model.py) with 25 times the examples of make test (about 5 minutes).
model-long: install
	COPIER_MODEL_SCALE=25 $(BIN)/python -m pytest tests/test_exactly_once_model.py --hypothesis-show-statistics

# The fault-injection suite: SEEDS seeds of the real pipeline under faults (a few minutes each).
# An interrupted run goes on where it stopped when the code is the same (--resume);
# remove docs/reliability.json to start over.
SEEDS ?= 50
chaos: install
	$(BIN)/python -m copier.chaos --seeds $(SEEDS) --report docs/reliability.md --json docs/reliability.json --resume

# Benchmarks against baselines in one run: docs/benchmarks.md, .json and PNG plots (about half an hour).
bench: install
	$(BIN)/python -m copier.bench --out docs

# The release bundle scripts/copier.yaml installs from: the wheel, the installer, the units, the sample config;
# and the .zip that spark-submit --py-files ships to a cluster (README, "The staging writer").
VERSION = $(shell sed -n 's/^version = //p' setup.cfg)
dist: install
	rm -rf dist/copier-$(VERSION) && mkdir -p dist/copier-$(VERSION)/scripts dist/copier-$(VERSION)/properties
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w dist/copier-$(VERSION) .
	@# The same wheel under a name Spark's Python workers import from (spark-submit --py-files).
	cp dist/copier-$(VERSION)/copier-$(VERSION)-py3-none-any.whl dist/copier-$(VERSION)/copier-$(VERSION)-py3-none-any.zip
	cp scripts/install.sh scripts/copier.service scripts/copier-scale-in.service scripts/copier.env dist/copier-$(VERSION)/scripts/
	cp properties/copier.properties dist/copier-$(VERSION)/properties/
	cp README.md dist/copier-$(VERSION)/
	tar -C dist -czf dist/copier-$(VERSION).tar.gz copier-$(VERSION)
	@echo "dist/copier-$(VERSION).tar.gz: upload it to S3 and give its bucket and key to scripts/copier.yaml"

lint: install
	$(BIN)/ruff check copier tests
	$(BIN)/mypy copier

clean:
	rm -rf dist build *.egg-info $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
