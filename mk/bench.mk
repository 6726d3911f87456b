# Benchmarks and long-running proofs: `make bench`, `make fuzz`, `make soak`.
#
# make bench   one table (stdout) + $(BENCH_DIR)/bench.json, from:
#              criterion (verify + parse + route vs bare HMAC-SHA256; decide()), the official
#              Python SDK on the same signed deliveries, the webhook bootstrap's cold start
#              against local Lambda Runtime API / AWS stubs, and worker throughput on the
#              embedded backend, and time to executor (connection request →
#              environment connected, warm and cold, real pinned codex and the stand-in,
#              in local mode), and the warm pool refill's calls after 100 / 1,000 / 10,000
#              members claimed, and the delay of due rechecks while a sweep of 10,000
#              environments is in flight (sweep queue vs one queue, simulated), and the
#              simulated Fargate time to executor, warm and cold. Details:
#              crates/bench.
# make fuzz    cargo-fuzz on the webhook entry point for FUZZ_SECONDS (default 600).
# make soak    the long simulation (crates/testkit): 1,000,000 schedules.
.PHONY: bench bench-build fuzz fuzz-seeds soak

BENCH_DIR := $(abspath $(TARGET_DIR))/bench
BENCH_BIN := $(TARGET_DIR)/release/sandbox-bench
# The Lambda bootstraps' profile (root Cargo.toml): what `make build` ships.
LAMBDA_PROFILE := lambda-bootstrap
WEBHOOK_BOOTSTRAP := $(TARGET_DIR)/$(LAMBDA_PROFILE)/webhook
BENCH_COLD_RUNS ?= 25
BENCH_ENVIRONMENTS ?= 2100
# Worker loops of the third throughput run (`sandboxctl serve --workers`; the default is 2).
BENCH_MANY_WORKERS ?= 16
# Deployment sizes of the scale table (ECS calls per job and per sweep).
BENCH_SCALE_SIZES ?= 100,1000,10000
# Sessions per time-to-executor row (executor × warm/cold; at least 200).
BENCH_TTE_SESSIONS ?= 200
# The pinned codex the time-to-executor rows run (infra/executor, npm ci; mk/infra.mk).
BENCH_CODEX := $(INFRA)/executor/node_modules/.bin/codex
FUZZ_SECONDS ?= 600
FUZZ_DIR := $(abspath $(TARGET_DIR))/fuzz
# cargo-fuzz needs nightly flags; the machine has stable only.
FUZZ_ENV := RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=$(FUZZ_DIR)/target

# Everything is built before anything is timed (and before the deliveries are signed:
# the Python SDK refuses timestamps older than 300 s).
bench-build:
	cargo build --locked --release -p sandbox-bench --bins
	cargo build --locked --release -p agents-sim --bin sim-executor
	cargo bench --locked -p sandbox-bench --benches --no-run
	cargo build --locked --profile $(LAMBDA_PROFILE) -p sandbox-lambda --no-default-features --features webhook --bin webhook

# The pinned codex first (as rust-test): the time-to-executor rows run the real
# `codex exec-server --listen` (without it they fall back to the stand-in, loudly).
bench: venv infra-node-check $(INFRA)/executor/node_modules/.installed bench-build
	rm -rf $(BENCH_DIR) && mkdir -p $(BENCH_DIR)
	$(BENCH_BIN) deliveries --out $(BENCH_DIR)/deliveries.json --count 1000
	$(PY) scripts/bench/python_verify.py $(BENCH_DIR)/deliveries.json --out $(BENCH_DIR)/python.json
	SANDBOX_BENCH_DELIVERIES=$(BENCH_DIR)/deliveries.json CRITERION_HOME=$(BENCH_DIR)/criterion \
		cargo bench --locked -p sandbox-bench --benches > $(BENCH_DIR)/criterion.log
	$(BENCH_BIN) cold-start --bootstrap $(WEBHOOK_BOOTSTRAP) --runs $(BENCH_COLD_RUNS) --out $(BENCH_DIR)/cold_start.json
	$(BENCH_BIN) throughput --environments $(BENCH_ENVIRONMENTS) --duplicate-share 0.3 --workers 2 --storage /dev/shm --out $(BENCH_DIR)/throughput_tmpfs.json
	$(BENCH_BIN) throughput --environments $(BENCH_ENVIRONMENTS) --duplicate-share 0.3 --workers 2 --out $(BENCH_DIR)/throughput.json
	$(BENCH_BIN) throughput --environments $(BENCH_ENVIRONMENTS) --duplicate-share 0.3 --workers $(BENCH_MANY_WORKERS) --out $(BENCH_DIR)/throughput_many_workers.json
	$(BENCH_BIN) transitions --out $(BENCH_DIR)/transitions.json
	$(BENCH_BIN) scale --sizes $(BENCH_SCALE_SIZES) --out $(BENCH_DIR)/scale.json
	$(BENCH_BIN) pool-refill --claimed $(BENCH_SCALE_SIZES) --out $(BENCH_DIR)/pool_refill.json
	$(BENCH_BIN) recheck-delay --environments 10000 --out $(BENCH_DIR)/recheck_delay.json
	$(BENCH_BIN) fargate-time --sessions 1000 --out $(BENCH_DIR)/fargate_time.json
	$(BENCH_BIN) time-to-executor --sessions $(BENCH_TTE_SESSIONS) --codex $(BENCH_CODEX) \
		--sim-executor $(TARGET_DIR)/release/sim-executor --out $(BENCH_DIR)/time_to_executor.json
	@$(BENCH_BIN) report --dir $(BENCH_DIR) --criterion $(BENCH_DIR)/criterion

# The seed corpus (committed under fuzz/seeds): every events/webhooks fixture, signed.
fuzz-seeds:
	cargo run --locked --release -p sandbox-bench -- fuzz-seeds --events events/webhooks --out fuzz/seeds/webhook_entry

fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	mkdir -p $(FUZZ_DIR)/corpus
	@echo "fuzzing webhook_entry for $(FUZZ_SECONDS) s; log: $(FUZZ_DIR)/last-run.log"
	cd fuzz && $(FUZZ_ENV) cargo fuzz run -O webhook_entry $(FUZZ_DIR)/corpus seeds/webhook_entry \
		-- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 > $(FUZZ_DIR)/last-run.log 2>&1; \
		rc=$$?; tail -n 25 $(FUZZ_DIR)/last-run.log; exit $$rc

# 1,000,000 schedules with the ECS-like compute twin, the warm pool on in 30 % of
# them (claims, refills, recycles, members dying idle and claimed); SOAK_SCHEDULES and
# SOAK_BASE (the seeds' base) to change them.
SOAK_SCHEDULES ?= 1000000
SOAK_BASE ?= 0
soak:
	SIM_SCHEDULES=$(SOAK_SCHEDULES) SIM_BASE=$(SOAK_BASE) cargo test --locked --release -p sandbox-testkit --test simulation -- --nocapture
