# Quick start (a fresh machine with Python 3.11+ and Java 17):
#   make demo   # the exactly-once demo with two hard driver kills
#   make test   # the test suite as CI runs it: unit, Spark, conformance crash tests, integration
#   make check  # the fast lane for the edit-test loop: lint, unit tests, contract checks
#
# Every tool runs as `<python> -m <tool>`, never as a console script found on PATH: pip puts
# those in the interpreter's bin directory, which pyenv only sees after `pyenv rehash` and
# an inactive virtual environment not at all.
#
# PYTHON is the interpreter to install into and run with (make demo PYTHON=python3.12).
# A system Python that pip must not change (PEP 668, e.g. Debian's) gets a virtual
# environment .venv here instead; RUN is the interpreter that has the packages.
PYTHON ?= python3
RUN = $(shell $(PYTHON) scripts/install.py --python)
PYTEST_ARGS ?=

.PHONY: install demo test test-full lint check

install:
	$(PYTHON) scripts/install.py

demo: install
	$(RUN) -m epochal demo

test:
	PYTHON="$(PYTHON)" bash scripts/test.sh $(PYTEST_ARGS)

# every test, the full lane's proofs too (the root conftest.py's FULL_LANE_ONLY)
test-full:
	EPOCHAL_TEST_LANE=full PYTHON="$(PYTHON)" bash scripts/test.sh $(PYTEST_ARGS)

lint: install
	$(RUN) -m ruff check . && $(RUN) -m ruff format --check .

# The edit-test loop (under a minute and a half here): lint, types, the unit tests, the map connector's tests
# and the kit's contract checks (no Spark, no servers). `make test` is the whole suite.
check: lint
	$(RUN) -m mypy
	$(RUN) -m pytest -p no:cacheprovider -q -n 2 --dist loadgroup --no-loadscope-reorder -m "not spark" \
		tests/unit tests/map tests/conformance
