# Plain entry points. Every target builds its own virtual environment, so a fresh clone needs
# nothing but python3 (>= 3.11) and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo walkthrough test check lint typecheck bench bench-apply clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raftbroker demo

walkthrough: $(STAMP)
	$(BIN)/raftbroker walkthrough

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict

check: lint typecheck

bench: $(STAMP)
	$(BIN)/python -m bench

bench-apply: $(STAMP)
	$(BIN)/python -m bench.apply

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
