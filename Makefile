# Set-up and the two things a new user runs. Everything installs into ./.venv from PyPI;
# Kafka's jars come from Maven Central on first use (see `picrl kafka --help`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PICRL := $(VENV)/bin/picrl

.PHONY: setup up test lint clean prometheus

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

## the main job: local Kafka, a stream worker, the trainer and the closed loop on GenAI-Mem's test split
up: setup
	$(PICRL) up --out runs/up

# Prometheus and promtool (Debian's prometheus package) for the alert-rule and scrape tests: installed when
# missing and apt-get can run (root); elsewhere those tests skip, and fail under CI=true.
prometheus:
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		echo "installing Debian's prometheus package (apt-get, as root) for the alert-rule and scrape tests" && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
		|| echo "note: prometheus not installed; its tests skip (and fail with CI=true)"; }

## guard rails: lint and format (ruff), types of picrl_core and stream (mypy), the import layers (import-linter)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

## the guard rails, then the whole test suite in two processes, a test file each at a time (each starts its own Kafka
## broker unless KAFKA_BOOTSTRAP_SERVERS is set)
test: setup prometheus lint
	$(PY) -m pytest -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache
