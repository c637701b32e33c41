# Quick start (a fresh machine with Python 3.11+ and Java 17):
#   make demo   # the exactly-once demo with two hard driver kills
#   make test   # the whole test suite: unit, Spark, conformance crash tests, integration
PYTHON ?= python3

.PHONY: install demo test lint

install:
	$(PYTHON) scripts/install.py

demo: install
	epochal demo

test:
	bash scripts/test.sh

lint: install
	ruff check . && ruff format --check .
