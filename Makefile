# keyshift: two commands on a fresh machine.
#   make demo   create the environment, fetch what is missing, start the local stack,
#               run the flight delay job on all 3,000,000 real flights, print the summary
#   make test   same set-up, then the test suite against the real stack (CI runs this)
#   make test-all  also the tests marked slow (more fault points, the overload test)
#   make docs   the documentation site (mkdocs.yml, docs/) into .keyshift/site, --strict (make test runs it)
# Both are idempotent: a second run reuses the environment, jars, data and running services.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.keyshift-installed
export PATH := $(abspath $(BIN)):$(PATH)
export PYSPARK_PYTHON := $(abspath $(BIN))/python
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN))/python

CHROMIUM ?= chromium

.PHONY: lint env setup stack browser demo docs test test-all unit clean-state

env: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; keyshift needs Python 3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip check
	touch $(STAMP)

setup: env
	$(BIN)/keyshift stack fetch
	$(BIN)/keyshift data fetch flights

stack: setup
	$(BIN)/keyshift stack up

# The browser test of the keyshift page (tests/integration/test_ui_plugin.py) drives Debian's
# Chromium with Playwright (from requirements.lock; it downloads no browser of its own).
browser:
	@command -v $(CHROMIUM) >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "error: $(CHROMIUM) not found; install it with \`sudo apt-get install -y chromium\`"; exit 1; fi; }
	@echo "browser for the UI test: $$(command -v $(CHROMIUM))"

demo: stack
	$(BIN)/keyshift run demo

# The docs site, built --strict: a broken link, a page left out of the nav or a reference that no
# longer generates fails the build (and so `make test`). Not committed: .keyshift/ is ignored.
docs: env
	NO_MKDOCS_2_WARNING=1 PYTHONWARNINGS=ignore::DeprecationWarning $(BIN)/mkdocs build --strict --quiet --site-dir .keyshift/site
	@echo "docs: .keyshift/site/index.html"

# The cluster tests (marker `cluster`: a Kafka, HDFS, S3 and Spark cluster of their own, on ports of
# their own), then the unit tests (no service), run in a second pytest process beside the stack's
# tests, which would otherwise wait 25 to 35 minutes for them; their output follows the rest's
# summary, and any of them failing fails the target.
CLUSTER_LOG := .keyshift/logs/pytest-cluster.log
define run_tests
	@mkdir -p .keyshift/logs; \
	echo "the cluster tests, then the unit tests, run beside the others in a second pytest process; their output: $(CLUSTER_LOG)"; \
	{ $(BIN)/python -m pytest -ra --durations=10 -p no:cacheprovider --basetemp=.keyshift/pytest-cluster -m cluster $(1) tests/integration; \
	  c=$$?; $(BIN)/python -m pytest -ra --durations=10 -p no:cacheprovider --basetemp=.keyshift/pytest-unit $(1) tests/unit; \
	  u=$$?; test $$c -eq 0 && test $$u -eq 0; } > $(CLUSTER_LOG) 2>&1 & cluster=$$!; \
	$(BIN)/python -m pytest -ra --durations=20 -m "not cluster" $(1) tests/dags tests/integration; rest=$$?; \
	wait $$cluster; clustered=$$?; \
	echo "=================== the cluster and unit tests ($(CLUSTER_LOG)) ==================="; cat $(CLUSTER_LOG); \
	test $$rest -eq 0 && test $$clustered -eq 0
endef

test: lint docs stack browser
	$(call run_tests,)

test-all: stack browser
	$(call run_tests,--run-slow)

# The package's layers (pyproject.toml [tool.importlinter]): an import up a layer fails.
lint: env
	$(BIN)/lint-imports

unit: env
	$(BIN)/python -m pytest -ra tests/unit tests/dags

clean-state:
	-$(BIN)/keyshift stack down
	rm -rf .keyshift runs
