# Set-up is part of every target: a fresh machine needs only Python 3.10+ and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast lint goldens clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[verify,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=40

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check migrate rules tests bench scripts
	$(BIN)/python scripts/typecheck.py  # mypy on migrate/ and rules/, as tfmigrate.* (pyproject)

# Rewrite fixtures/goldens from the current code; review the diff like code.
goldens: $(STAMP)
	$(BIN)/python tests/goldens.py

clean:
	rm -rf $(VENV) out
