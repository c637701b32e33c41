# Quick start (a fresh machine with Python 3.11+ and Java 17):
#   make demo   # the exactly-once demo with two hard driver kills
#   make test   # the whole test suite: unit, Spark, conformance crash tests, integration
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

.PHONY: install demo test lint

install:
	$(PYTHON) scripts/install.py

demo: install
	$(RUN) -m epochal demo

test:
	PYTHON="$(PYTHON)" bash scripts/test.sh $(PYTEST_ARGS)

lint: install
	$(RUN) -m ruff check . && $(RUN) -m ruff format --check .
