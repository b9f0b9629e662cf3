# Plain entry points. Every target builds its own virtual environment, so a fresh clone needs
# nothing but python3 (>= 3.11) and make, and Java 17+ for `make test` (the Spark tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# PySpark (pipeline/ and its tests, and the type check of both) is big: the demo goes without.
SPARK_STAMP := $(VENV)/.installed-spark

.PHONY: demo walkthrough test test-spark check lint typecheck docs bench bench-apply clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(SPARK_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(SPARK_STAMP)

demo: $(STAMP)
	$(BIN)/raftbroker demo

walkthrough: $(STAMP)
	$(BIN)/raftbroker walkthrough

test: $(SPARK_STAMP)
	$(BIN)/pytest

test-spark: $(SPARK_STAMP)
	$(BIN)/pytest -m spark tests/pipeline

# docs/design.md's module map and error table, written from the code (docs/generate.py).
docs: $(STAMP)
	$(BIN)/python docs/generate.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(SPARK_STAMP)
	$(BIN)/mypy --strict

check: lint typecheck

bench: $(STAMP)
	$(BIN)/python -m bench

bench-apply: $(STAMP)
	$(BIN)/python -m bench.apply

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
