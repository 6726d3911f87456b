# sandbox-lifecycle: one entry point for people and CI.
#   make run    the whole pipeline on the embedded default (local mode)
#   make test   fmt check, clippy -D warnings, every Rust test, the Python cross-checks,
#               and no process left behind (tests/leftovers/run.py)
#   make build  the three Lambda functions as arm64 bootstrap zips (cargo-lambda)
#   make bench  the performance table (mk/bench.mk; also soak, fuzz)
#   make deploy-sam, make deploy-cdk   (mk/infra.mk)
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# Absolute: cargo runs tests from the package directory.
SIM_JSON := $(abspath $(TARGET_DIR))/sim-json
# `make build` output: one directory per function with `bootstrap.zip` in it.
LAMBDA_DIR := $(abspath $(TARGET_DIR))/lambda
# The Lambda build: profile `lambda-bootstrap` (root Cargo.toml: size-optimized, fat LTO,
# panic = abort, stripped), arm64, one zip per function.
LAMBDA_BUILD := cargo lambda build --profile lambda-bootstrap --arm64 --locked -p sandbox-lambda --output-format zip --lambda-dir $(LAMBDA_DIR)
# cargo-nextest ships with the machine image; plain cargo test is the fallback.
RUST_TEST := $(if $(shell command -v cargo-nextest 2>/dev/null),cargo nextest run --no-fail-fast,cargo test --no-fail-fast)
# The simulator's JSON-producing test, selected the same way under either runner (and
# built with the workspace's feature set, so nothing is rebuilt).
SIM_JSON_FILTER := $(if $(shell command -v cargo-nextest 2>/dev/null),-E 'package(agents-sim) & binary(api) & test(produced_json)',--test api produced_json)
# sandboxctl's AWS backend is a cargo feature (`aws`, off by default: `make run` builds none
# of the AWS SDK). Everything `make test` builds has it: the e2e suites run
# `sandboxctl --backend aws`, and one feature set for every step means nothing is rebuilt.
ALL_FEATURES := --features sandboxctl/aws

.PHONY: help run test test-steps build fmt-check clippy rust-test codex-canary doc-test crosscheck \
	leftovers-test venv build-venv clean

include mk/infra.mk mk/bench.mk

help:
	@echo "make run    run the pipeline locally (embedded default)"
	@echo "make test   everything CI runs"
	@echo "make build  the Lambda functions as arm64 zips under $(LAMBDA_DIR)"
	@echo "make bench  the performance table (also make soak, make fuzz)"
	@echo "make codex-canary   the tests that run the real pinned codex (before moving its pin)"
	@echo "make deploy-sam / make deploy-cdk   deploy (make deploy-help lists the variables)"

# The whole pipeline on 127.0.0.1: simulator, webhook endpoint, workers, sweeper, SQLite,
# child-process executors; prints the timeline and a summary. sandboxctl without its `aws`
# feature: the demo needs none of the AWS SDK.
#   make run                  the fast stand-in (`sim-executor`) as listener and forwarder
#   make run EXECUTOR=codex   the pinned codex (infra/executor, installed first if missing)
#                             as listener and forwarder, registering with the simulator
EXECUTOR ?= stand-in
ifeq ($(EXECUTOR),codex)
RUN_PREREQS := infra-node-check $(INFRA)/executor/node_modules/.installed
RUN_EXECUTOR = $(abspath $(INFRA)/executor/node_modules/.bin/codex)
else ifeq ($(EXECUTOR),stand-in)
RUN_PREREQS :=
RUN_EXECUTOR = $(TARGET_DIR)/debug/sim-executor
else
$(error EXECUTOR must be stand-in (default) or codex, not '$(EXECUTOR)')
endif

run: $(RUN_PREREQS)
	cargo build --locked -p sandboxctl -p agents-sim --bins
	$(TARGET_DIR)/debug/sandboxctl demo --executor $(RUN_EXECUTOR)

# Every step runs below tests/leftovers/run.py (a child subreaper): the run fails, naming
# them, when processes a test started (an executor, moto, a stub) outlive it, and ends them.
test:
	$(PYTHON) tests/leftovers/run.py $(MAKE) --no-print-directory test-steps

test-steps: fmt-check clippy rust-test doc-test crosscheck infra-test leftovers-test

fmt-check:
	cargo fmt --all -- --check

clippy:
	cargo clippy --workspace --all-targets --locked $(ALL_FEATURES) -- -D warnings

# The AWS adapter suites run against a moto server that tests/moto/run.sh starts on
# 127.0.0.1 (a free port) for the duration of the command.
# The pinned codex (infra/executor, npm ci) first: the issue-26 E2E runs the real
# `codex exec-server --listen` and fails (never skips) without it.
rust-test: venv infra-node-check $(INFRA)/executor/node_modules/.installed
	tests/moto/run.sh $(RUST_TEST) --workspace --locked $(ALL_FEATURES)

# The tests that hand the real pinned codex a command line or a byte: what must pass before
# the pin in infra/executor/package.json moves (docs/OPERATING.md, "Moving the codex pin").
CODEX_CANARY := binary(codex_command_lines) | binary(executor_socket) | binary(relay) | test(real_codex) | test(the_stand_in_accepts_exactly_what_codex_accepts) | test(fargate_entrypoint_roles_relay_a_turn_with_the_real_codex)

codex-canary: venv infra-tools $(INFRA)/executor/node_modules/.installed
	tests/moto/run.sh cargo nextest run --no-fail-fast --workspace --locked $(ALL_FEATURES) -E '$(CODEX_CANARY)'
	$(INFRA_BIN)/python -m pytest -q -p no:cacheprovider $(INFRA)/tests/test_executor.py $(INFRA)/tests/test_await_assignment.py $(INFRA)/tests/test_preflight_role.py

doc-test:
	cargo test --workspace --doc --locked $(ALL_FEATURES)

# The three functions for AWS Lambda (provided.al2023, arm64). The webhook is built on
# its own without default features, so it links only the SQS and Secrets Manager clients.
build: build-venv
	rustup target add aarch64-unknown-linux-gnu
	PATH="$(abspath $(VENV))/bin:$$PATH" $(LAMBDA_BUILD) --no-default-features --features webhook --bin webhook
	PATH="$(abspath $(VENV))/bin:$$PATH" $(LAMBDA_BUILD) --no-default-features --features worker,sweeper --bin worker --bin sweeper
	@for f in webhook worker sweeper; do \
	  printf '%-8s %10d bytes  %s\n' $$f $$(stat -c %s $(LAMBDA_DIR)/$$f/bootstrap.zip) $(LAMBDA_DIR)/$$f/bootstrap.zip; \
	done

build-venv: $(VENV)/.build-installed

$(VENV)/.build-installed: crates/lambda/requirements-build.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r crates/lambda/requirements-build.txt
	touch $@

venv: $(VENV)/.installed

$(VENV)/.installed: tests/crosscheck/requirements.txt tests/moto/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/crosscheck/requirements.txt -r tests/moto/requirements.txt
	touch $@

crosscheck: venv
	cargo build -p sandboxctl --locked --features aws
	SANDBOXCTL=$(TARGET_DIR)/debug/sandboxctl $(PY) -m pytest tests/crosscheck -q
	rm -rf $(SIM_JSON)
	SIM_JSON_OUT=$(SIM_JSON) $(RUST_TEST) --workspace --locked $(ALL_FEATURES) $(SIM_JSON_FILTER)
	$(PY) crates/agents-sim/crosscheck/validate_sim_json.py $(SIM_JSON)

# The leftover check's own tests: it fails on a leftover and ends it, and never looks at a
# process it did not start.
leftovers-test: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/leftovers

clean:
	cargo clean
	rm -rf $(VENV)
