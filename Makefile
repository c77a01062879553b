# countersink — every entry point a developer or CI needs. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
QUIX_VENV ?= .venv-quix
QUIX_STAMP := $(QUIX_VENV)/.installed-stamp

.PHONY: help venv constraints lint tools test unit integration services-up services-down services-status demo bench bench-apply chaos audit clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

venv: $(STAMP)  ## create .venv with countersink and its development tools (versions from constraints.txt)

constraints:  ## rewrite constraints.txt from a fresh resolve of pyproject.toml's dependencies (run on Python 3.11)
	rm -rf $(VENV).constraints
	$(PYTHON) -m venv $(VENV).constraints
	$(VENV).constraints/bin/python -m pip install --quiet --upgrade pip
	$(VENV).constraints/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '/^#/p' constraints.txt; $(VENV).constraints/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(VENV).constraints

lint: $(STAMP)  ## ruff and mypy (strict)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# kustomize, kubeconform and promtool (built with `go install`, so Go is needed) and the Kubernetes schemas, pinned
# in tests/gotools.py and kept in .tools/: the deployment tests install what is missing themselves; this does it
# ahead, and fails with the reason when it cannot.
tools: $(STAMP)  ## build the tools the deployment tests run (kustomize, kubeconform, promtool) into .tools/
	$(PY) -m tests.gotools

test: lint tools  ## everything: lint, unit, property and integration tests (starts and stops the servers itself)
	$(PY) -m tests.suite

unit: $(STAMP)  ## unit and property tests only (no servers)
	$(PY) -m pytest tests/unit

integration: $(STAMP)  ## integration tests only
	$(PY) -m pytest tests/integration

services-up: $(STAMP)  ## start Kafka (127.0.0.1:9092), Cassandra (127.0.0.1:9042) and a schema registry (:8085) in the background
	$(PY) -m stack up

services-down: $(STAMP)  ## stop what services-up started
	$(PY) -m stack down

services-status: $(STAMP)  ## show what services-up started
	$(PY) -m stack status

demo: $(STAMP)  ## the whole pipeline on sample events, every counter kind beside the truth (exit 0 = all match)
	$(PY) -m demo

$(BENCH_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	@touch $@

# Quix Streams in a virtual environment of its own: it pins pydantic releases older than constraints.txt's, and
# installed into .venv it would change the versions every other target runs on.
$(QUIX_STAMP): bench/quix-requirements.txt
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(QUIX_VENV)/bin/python -m pip install --quiet -r bench/quix-requirements.txt
	@touch $@

bench: $(BENCH_STAMP) $(QUIX_STAMP)  ## countersink beside raw aiokafka, counter columns, Quix Streams and Kafka Streams; writes bench/results/REPORT.md
	$(PY) -m bench.pipeline --quix-python $(QUIX_VENV)/bin/python $(BENCH_ARGS)
	$(PY) -m bench.backfill $(BENCH_BACKFILL_ARGS)

bench-apply: $(STAMP)  ## apply throughput per kind and bytes per stored state (no servers)
	$(PY) -m bench.apply

chaos: $(STAMP)  ## 1M events plus 20k in transactions, 3 consumers, kill -9, restarts, a zombie; ends with lost=0 duplicated=0 (CHAOS_ARGS="--quick": CI's short run)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

# pip-audit lives in a virtualenv of its own, so that the audit covers countersink's dependencies, not its own.
AUDIT_VENV := .venv-audit
$(AUDIT_VENV)/.installed-stamp:
	$(PYTHON) -m venv $(AUDIT_VENV)
	$(AUDIT_VENV)/bin/python -m pip install --quiet 'pip-audit>=2.7,<3'
	@touch $@

audit: $(STAMP) $(AUDIT_VENV)/.installed-stamp  ## the installed dependencies against known vulnerabilities (pip-audit; fails when any package could not be checked)
	$(PY) -m pip freeze --exclude-editable > $(VENV)/audited-requirements.txt
	$(AUDIT_VENV)/bin/pip-audit --strict --no-deps --disable-pip --progress-spinner off \
		--requirement $(VENV)/audited-requirements.txt

clean:  ## remove the virtualenv and the local servers' data
	-$(PY) -m stack down 2>/dev/null
	rm -rf $(VENV) $(AUDIT_VENV) $(QUIX_VENV) .tools .stack .pytest_cache .mypy_cache .ruff_cache .hypothesis
