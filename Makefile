# The two commands of the quick start: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test lint fixtures clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/nnserve serve --model-repository model_repository

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Regenerates tests/fixtures from PyTorch models (needs torch and pnnx: the `dev` extra).
fixtures:
	$(PYTHON) -m venv .venv-dev
	.venv-dev/bin/pip install -q -e '.[dev]'
	.venv-dev/bin/python tools/make_fixtures.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
