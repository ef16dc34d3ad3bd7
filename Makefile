# The two commands of the quick start: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test lint fixtures clean fuzz

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

# Coverage-guided fuzzing of both model readers (atheris: the `fuzz` extra), FUZZ_SECONDS each, one after the
# other. Inputs that break the readers' contract are saved in build/fuzz/<reader>/ (tests/fuzz/fuzz_readers.py);
# it fails while any is there: fix it, copy it to tests/fuzz/regressions/<reader>/, delete it.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(PY) -m pip install -q 'atheris>=2.3'  # the `fuzz` extra's one package
	for kind in pnnx tnn; do \
		$(PY) tests/fuzz/fuzz_readers.py $$kind --keep-going -max_total_time=$(FUZZ_SECONDS) || exit 1; done
	@! ls build/fuzz/*/crash-* build/fuzz/*/failure-* 2>/dev/null

# Regenerates tests/fixtures from PyTorch models (needs torch and pnnx: the `dev` extra).
fixtures:
	$(PYTHON) -m venv .venv-dev
	.venv-dev/bin/pip install -q -e '.[dev]'
	.venv-dev/bin/python tools/make_fixtures.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
