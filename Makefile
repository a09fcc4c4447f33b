# copier: everything is installed into .venv/ at the repository root.
#
# Two installs: `make install` (what `make demo` and a local run need: copier, the KCL jars, the local backend,
# PySpark, the daemon's launcher, and with npm the second local backend's two servers into node/), and `make install-test` (what `make test`, `make lint` and `make chaos` need
# besides: pytest and the linters, checkov, and two programs from Debian's packages). Neither ever calls sudo
# without first saying what it installs and why.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
RUN_EXTRAS  := local,spark
TEST_EXTRAS := local,spark,test,lint,bench
# checkov (tests/test_deploy.py runs it on the templates) lives in a virtualenv of its own: it pins
# older boto3, botocore and packaging than copier's.
CHECKOV := $(VENV)/checkov/bin/checkov
# Programs the tests run, each with the Debian package that has it: systemd-analyze checks the systemd units
# (tests/test_deploy.py); faketime puts chaos seeds' processors off AWS time (copier/chaos/clocks.py).
TEST_PROGRAMS := systemd-analyze:systemd faketime:faketime

# The second local backend (copier local-backend --impl independent: kinesis-mock and dynalite, Node programs),
# at the versions node/package-lock.json pins, into node/node_modules: npm ci, never a global install, no sudo.
# --ignore-scripts: nothing in them needs an install script (dynalite's LevelDB binding ships prebuilt and is
# used only with --path; the backend keeps everything in memory).
NODE_STAMP := node/node_modules/.package-lock.json

.PHONY: install install-test test-programs test test-fast test-dist model-long demo lint chaos bench dist clean

# copier's launcher of the KCL daemon (copier/kcl/launcher.py), compiled against the KCL jars with javac;
# the wheel (and the release bundle) ships the jar, so hosts need no JDK.
LAUNCHER := copier/kcl/copier-kcl-launcher.jar
LAUNCHER_SOURCES := $(shell find copier/kcl/java -name '*.java')

install: $(STAMP) $(LAUNCHER) $(NODE_STAMP)

install-test: install $(TEST_STAMP) $(CHECKOV) test-programs

$(LAUNCHER): $(STAMP) $(LAUNCHER_SOURCES) copier/kcl/launcher.py
	$(BIN)/python -m copier.kcl.launcher --build

$(NODE_STAMP): node/package.json node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make install: npm not found: install Node.js (20 or later) with npm; the second local backend (kinesis-mock, dynalite) is two npm packages"; exit 1; }
	@echo "make install: kinesis-mock (npm kinesis-local) and dynalite into node/node_modules (npm ci: the versions of node/package-lock.json; the second local backend)"
	npm ci --prefix node --no-audit --no-fund --ignore-scripts
	touch $@

# amazon-kclpy is an sdist whose build downloads the KCL MultiLangDaemon jars
# from Maven Central (KCL_MVN_REPO_SEARCH_URL overrides the base URL); copier.kcl.jars
# --check checks that they arrived.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[$(RUN_EXTRAS)]'
	$(BIN)/python -m copier.kcl.jars --check
	touch $@

$(TEST_STAMP): $(STAMP)
	@echo "make install-test: pytest, hypothesis, ruff, mypy, cfn-lint and matplotlib into $(VENV) (setup.cfg's test, lint and bench extras: the tests, the linters and make bench use them)"
	$(BIN)/python -m pip install --quiet -e '.[$(TEST_EXTRAS)]'
	touch $@

$(CHECKOV):
	@echo "make install-test: checkov into $(VENV)/checkov (tests/test_deploy.py checks the CloudFormation templates with it; a virtualenv of its own: it pins older boto3 than copier's)"
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/python -m pip install --quiet checkov==3.3.30

# The programs of TEST_PROGRAMS that are missing, from Debian's packages: said first (what, why, and the
# command, with sudo -n when not root: it never waits for a password), then installed.
test-programs:
	@missing=""; for pair in $(TEST_PROGRAMS); do \
		command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	[ -z "$$missing" ] && exit 0; \
	echo "make install-test: the tests need systemd-analyze (Debian's systemd: it checks copier's systemd units) and faketime (libfaketime: the chaos tests run processors on skewed clocks)"; \
	command -v apt-get >/dev/null 2>&1 || { echo "make install-test: no apt-get here: install$$missing with this system's package manager"; exit 1; }; \
	sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n "); \
	echo "make install-test: installing the Debian packages$$missing: $${sudo}apt-get update; $${sudo}apt-get install -y$$missing"; \
	$${sudo}apt-get update -q && $${sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing

# Two pytest workers (pytest-xdist): most tests wait on leases, timeouts and child processes, so two
# share the 2 cores of a CI machine well; each worker starts its own local backend.
test: install-test
	$(BIN)/python -m pytest -n 2 --dist worksteal

demo: install
	$(BIN)/copier demo

test-fast: install-test
	$(BIN)/python -m pytest -m "not protocol"

# The exactly-once model (tests/test_exactly_once_model.py) with 25 times the examples of make test (about 5 minutes).
model-long: install-test
	COPIER_MODEL_SCALE=25 $(BIN)/python -m pytest tests/test_exactly_once_model.py --hypothesis-show-statistics

# The fault-injection suite: SEEDS seeds of the real pipeline under faults (a few minutes each).
# An interrupted run goes on where it stopped when the code is the same (--resume);
# remove docs/reliability.json to start over.
# PROFILE=limits runs the seeds under Kinesis' per-shard limits (docs/reliability.md, "The shard-limits profile"),
# into docs/reliability-limits.md and .json: another profile never starts the full profile's results over.
# BACKEND=independent runs them on kinesis-mock and dynalite (copier local-backend --impl independent) into
# docs/reliability-independent.md and .json (-independent after the profile's name): another backend never
# starts moto's results over. Every run's totals then go to the end of docs/reliability.md (scripts/reliability_runs.py).
SEEDS ?= 50
PROFILE ?= full
BACKEND ?= moto
CHAOS_OUT = $(if $(filter full,$(PROFILE)),docs/reliability,docs/reliability-$(PROFILE))$(if $(filter moto,$(BACKEND)),,-$(BACKEND))
chaos: install-test
	$(BIN)/python -m copier.chaos --backend $(BACKEND) --profile $(PROFILE) --seeds $(SEEDS) --report $(CHAOS_OUT).md --json $(CHAOS_OUT).json --resume; \
	status=$$?; $(BIN)/python scripts/reliability_runs.py docs && exit $$status

# Benchmarks against baselines in one run: docs/benchmarks.md, .json and PNG plots (40 to 55 minutes, and the
# control-plane simulation's day of 10,000 shards, copier.bench.sim: its CPU minutes are in its section), then
# docs/capacity.md from the new figures (copier plan --doc); docs/benchmarks-before-after.md sets each figure beside
# the baseline docs/benchmarks-before.json (scripts/bench_before_after.py).
# BENCH_ARGS="--keep DIR" keeps the work directory with every worker's log; "--only rolling" reruns a part.
BENCH_ARGS ?=
bench: install $(TEST_STAMP)
	$(BIN)/python -m copier.bench --out docs $(BENCH_ARGS)
	$(BIN)/python scripts/bench_before_after.py docs
	$(BIN)/python -m copier.commands.cli plan --doc > docs/capacity.md.new && mv docs/capacity.md.new docs/capacity.md

# The release bundle scripts/copier.yaml installs from (scripts/bundle.py): every wheel a host needs, for
# x86_64 and aarch64 hosts, with a lock of their SHA-256 and of the KCL jars', the installer, the units and
# the sample config; its SHA-256 goes to the template (ReleaseSha256). Also the .zip that spark-submit
# --py-files ships to a cluster (README, "The staging writer").
VERSION = $(shell sed -n 's/^version = //p' setup.cfg)
dist: install
	rm -rf dist/copier-$(VERSION) dist/copier-$(VERSION).tar.gz dist/copier-$(VERSION).tar.gz.sha256
	$(BIN)/python scripts/bundle.py build --out dist/copier-$(VERSION)
	@# The same wheel under a name Spark's Python workers import from (spark-submit --py-files).
	cp dist/copier-$(VERSION)/wheels/copier-$(VERSION)-py3-none-any.whl dist/copier-$(VERSION)/copier-$(VERSION)-py3-none-any.zip
	tar -C dist --owner=0 --group=0 --numeric-owner --sort=name -czf dist/copier-$(VERSION).tar.gz copier-$(VERSION)
	cd dist && sha256sum copier-$(VERSION).tar.gz | tee copier-$(VERSION).tar.gz.sha256
	@echo "dist/copier-$(VERSION).tar.gz: upload it to S3; give scripts/copier.yaml its bucket, key and SHA-256 (ReleaseSha256)"

# The release bundle built and installed offline (tests/test_bundle.py; also part of make test).
test-dist: install-test
	$(BIN)/python -m pytest tests/test_bundle.py

lint: install $(TEST_STAMP)
	$(BIN)/ruff check copier tests
	$(BIN)/mypy copier

clean:
	rm -rf dist build *.egg-info $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache $(LAUNCHER) node/node_modules
