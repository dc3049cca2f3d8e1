# The three commands of the README. `make setup` makes .venv/ in the project root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-all lint run bench
setup:
	bash infra/setup.sh

test:
	$(BIN)/python -m pytest -q

test-all:
	$(BIN)/python -m pytest -q -m "not gpu"

lint:
	$(BIN)/ruff check grpo_core tasks flows tests bench

run:
	$(BIN)/grpo run
