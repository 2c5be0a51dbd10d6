# The README's two commands: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test setup lint typecheck unit bench bench-http clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/sinal serve --demo

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: setup
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/pytest --cov --cov-report=term:skip-covered

bench: setup
	$(BIN)/python bench/ingest.py

bench-http: setup
	$(BIN)/python bench/http.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage sinal.db*
