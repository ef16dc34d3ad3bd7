# The two commands of the quick start: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# One stamp per extra: `make serve` installs the server extra only; `make test` the test extra (which includes the
# server extra, so it stamps both). A venv made by `make serve` therefore still gets the test extra from `make test`.
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-server

.PHONY: serve test walk lint fixtures clean tools fuzz fuzz-server realworld

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(SERVE_STAMP): pyproject.toml | $(PY)
	@echo "== installing nnserve and what serving needs (the server extra) into $(VENV)"
	$(PY) -m pip install -e '.[server]'
	touch $@

$(STAMP): pyproject.toml | $(PY)
	@echo "== installing nnserve with its test extra into $(VENV) (a few minutes the first time)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	$(VENV)/bin/nnserve serve --model-repository model_repository

# The suite on TEST_WORKERS pytest-xdist workers (2: CI's cores; much of the suite waits on servers, clients and
# installs in other processes, so two workers overlap even on two busy cores). --dist loadscope hands out whole
# modules (a class is its own unit), so a module's server fixture starts once, on one worker; the modules go out in
# the order tests/conftest.py sorts them (the longest first), not xdist's reorder by test count. One test on its
# own, in one process (pdb, -s): .venv/bin/python -m pytest -n 0 tests/...::test_name
TEST_WORKERS ?= 2
test: $(STAMP) tools
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# Tools from Debian that some tests use: promtool (the `prometheus` package) checks deploy/'s alert and recording
# rules. Installed where we can (root with apt-get, as on CI); elsewhere those tests skip and say how to install.
tools:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& echo "== installing promtool (Debian package prometheus)" \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
		|| echo "== promtool not installed (needs root and apt-get): the rule tests will skip"

# A new user's walk through README.md and docs/models.md on a fresh clone of HEAD (also part of `make test`).
walk: $(STAMP)
	$(PY) -m pytest -q tests/e2e

# The server's request decoders (REST and gRPC, hypothesis) and its REST API against its OpenAPI schema
# (schemathesis), long: `make test` runs the same properties with 150 examples each. FUZZ_EXAMPLES to change it.
FUZZ_EXAMPLES ?= 20000
fuzz-server: $(STAMP)
	NNSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider --timeout=0 \
		tests/server/test_fuzz_decoders.py tests/server/test_reliability_openapi.py

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

# The real-world model suite (not part of `make test`: too big). tools/make_realworld.py exports every model into
# bench/realworld/ once with the dev extra (DEV_PY=... uses another interpreter that has it; delete a model's folder
# to export it again), then tools/check_realworld.py runs each on nnserve and writes docs/realworld.md.
DEV_VENV := .venv-dev
DEV_PY ?= $(DEV_VENV)/bin/python

$(DEV_VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(DEV_VENV)
	$(DEV_VENV)/bin/pip install -q -e '.[dev]'
	touch $@

realworld: $(STAMP)
	@if [ "$(DEV_PY)" = "$(DEV_VENV)/bin/python" ]; then $(MAKE) --no-print-directory $(DEV_VENV)/.installed-dev; fi
	$(DEV_PY) tools/make_realworld.py --missing
	$(PY) tools/check_realworld.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Triton's own Python client examples (the src/python/examples folder of triton-inference-server/client) against
# nnserve on a repository of the models they expect: prints example -> pass/fail/reason. The examples' client side
# needs Pillow and attrdict (image examples) and pkg_resources (tritonclient's shared-memory module; setuptools 81
# dropped it), installed here by name; the server's image decoding step uses Pillow too.
.PHONY: triton-examples
triton-examples: $(STAMP)
	@test -n "$(EXAMPLES)" || { echo "usage: make triton-examples EXAMPLES=<client repo>/src/python/examples"; exit 2; }
	$(PY) -m pip install -q Pillow attrdict 'setuptools<81'
	$(PY) tools/run_triton_examples.py $(EXAMPLES)
