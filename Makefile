# sandbox-lifecycle: one entry point for people and CI.
#   make run    the whole pipeline on the embedded default (local mode)
#   make test   fmt check, clippy -D warnings, every Rust test, the Python cross-checks
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# cargo-nextest ships with the machine image; plain cargo test is the fallback.
RUST_TEST := $(if $(shell command -v cargo-nextest 2>/dev/null),cargo nextest run --no-fail-fast,cargo test --no-fail-fast)

.PHONY: help run test fmt-check clippy rust-test doc-test crosscheck venv clean

help:
	@echo "make run    run the pipeline locally (embedded default)"
	@echo "make test   everything CI runs"

run:
	@echo "make run will start, on 127.0.0.1: the Agents API simulator, the webhook endpoint"
	@echo "(the Lambda's handler code), the worker loop, the sweeper timer, SQLite for queue"
	@echo "and registry, and child-process executors, then drive a scripted scenario of signed"
	@echo "deliveries and print the timeline. The local pipeline is not built yet (issue 3)."
	@exit 1

test: fmt-check clippy rust-test doc-test crosscheck

fmt-check:
	cargo fmt --all -- --check

clippy:
	cargo clippy --workspace --all-targets --locked -- -D warnings

rust-test:
	$(RUST_TEST) --workspace --locked

doc-test:
	cargo test --workspace --doc --locked

venv: $(VENV)/.installed

$(VENV)/.installed: tests/crosscheck/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/crosscheck/requirements.txt
	touch $@

crosscheck: venv
	cargo build -p sandboxctl --locked
	SANDBOXCTL=$(TARGET_DIR)/debug/sandboxctl $(PY) -m pytest tests/crosscheck -q

clean:
	cargo clean
	rm -rf $(VENV)
