# The two commands of the README:
#   make demo   set everything up, then run the simulated datacenter end to end
#   make test   set everything up, then lint, type-check, check the layers and contracts/, run the whole test suite
# "Set up" means: a virtual environment with vmsched installed, the three servers answering
# (started if they are installed locally), the database created if missing and migrated.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup servers browser migrate demo test lint bench faults contracts up clean

# The example plugin package is installed too: its units are in every service's catalogue, and the
# plugin tests (tests/unit/test_plugins.py, tests/e2e/test_plugin_units.py) use it.
EXAMPLE_UNITS := examples/vmsched-example-units

$(STAMP): pyproject.toml $(EXAMPLE_UNITS)/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e $(EXAMPLE_UNITS)
	touch $(STAMP)

servers:
	./scripts/servers.sh

# Chromium for the console's browser tests (installed with apt-get when missing; they skip without it).
browser:
	./scripts/browser.sh

migrate: $(STAMP) servers
	$(BIN)/vmsched db migrate

setup: migrate browser

demo: setup
	$(BIN)/vmsched demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/vmsched contracts --check

test: setup lint
	$(BIN)/pytest

bench: setup
	$(BIN)/vmsched bench

# The fault suite at full size (minutes; restarts the broker app once: run it on a machine of your own).
faults: setup
	$(BIN)/vmsched chaos --long

contracts: $(STAMP)
	$(BIN)/vmsched contracts

up: setup
	$(BIN)/vmsched up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache bench-results
