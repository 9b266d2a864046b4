# ferry — the front door. Every target sets up what it needs on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
DEPS_STAMP := $(VENV)/.stamp-deps
PROTO_STAMP := ferry/v1/.stamp-proto
FERRY_PROTOS := $(wildcard proto/ferry/v1/*.proto)
# apache.rocketmq.v2, wire-identical to the RocketMQ 5 SDKs (see the .proto headers). Its own
# directory is the include root, so protobuf names the files as the official SDK does
# (definition.proto, service.proto) and both load in one process; protoc then writes bare
# `import x_pb2` lines, which the proto recipe rewrites into package imports.
RMQ_PROTO_DIR := proto/apache/rocketmq/v2
RMQ_PROTOS := $(wildcard $(RMQ_PROTO_DIR)/*.proto)
RMQ_OUT := apache/rocketmq/v2
PROTOS := $(FERRY_PROTOS) $(RMQ_PROTOS)
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k namesrv -x"
PYTEST_ARGS ?=
# Where `make run` keeps its data.
DATA_DIR ?= var
# Which deploy/k8s overlay `make run` starts: 2m-2s-failover (masters elected in etcd),
# 2m-2s-sync, 2m-2s-async or 2m-noslave.
TOPOLOGY ?= 2m-2s-failover
# Extra `ferry dev` arguments, e.g. make run ARGS="--port-offset 1000"
ARGS ?=

# Apache RocketMQ's jars (tests/compat/pom.xml), resolved from Maven Central into .cache/rocketmq.
APACHE_STAMP := .cache/rocketmq/.stamp
COMPAT_SOURCES := $(shell find tests/compat -name pom.xml -o -name '*.java' 2>/dev/null)

# The Go RocketMQ clients' programs, built into .cache/go/bin: tests/compat/go on the 4.x
# client (rocketmq-client-go/v2), tests/compat/go5 on RocketMQ 5's official SDK
# (rocketmq-clients/golang/v5: the benchmarks' v2 load generator, v2send).
GO_STAMP := .cache/go/bin/.stamp
GO_SOURCES := $(shell find tests/compat/go tests/compat/go5 -name '*.go' -o -name go.mod -o -name go.sum 2>/dev/null)

.PHONY: help venv proto tools etcd apache go-clients bench-tools test run lint bench bench-quick chaos fuzz clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

venv: $(DEPS_STAMP)  ## create .venv with ferry, its development tools and ferry_native (needs cargo)

# ferry_native (native/, Rust) is built by pip through maturin; cargo fetches its crates.
# rustup installs cargo into ~/.cargo/bin, which a non-login shell may not have on PATH.
export PATH := $(HOME)/.cargo/bin:$(PATH)
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs) native/pyproject.toml \
	native/ferry_native.pyi

$(DEPS_STAMP): pyproject.toml $(NATIVE_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@command -v cargo >/dev/null || { echo "make venv needs Rust's cargo (1.85+, e.g. from" \
	  "https://rustup.rs; Debian 12's is too old) to build ferry_native from native/" >&2; exit 1; }
	$(PY) -m pip install --quiet ./native
	touch $@

proto: $(PROTO_STAMP)  ## generate ferry/v1 and apache/rocketmq/v2 from proto/ (python, grpc and typing stubs)

$(PROTO_STAMP): $(PROTOS) $(DEPS_STAMP)
	rm -f ferry/v1/*_pb2*.py ferry/v1/*_pb2*.pyi $(RMQ_OUT)/*_pb2*.py $(RMQ_OUT)/*_pb2*.pyi
	PATH="$(abspath $(BIN)):$$PATH" $(PY) -m grpc_tools.protoc -I proto \
		--python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(FERRY_PROTOS)
	PATH="$(abspath $(BIN)):$$PATH" $(PY) -m grpc_tools.protoc -I $(RMQ_PROTO_DIR) \
		--python_out=$(RMQ_OUT) --grpc_python_out=$(RMQ_OUT) \
		--mypy_out=$(RMQ_OUT) --mypy_grpc_out=$(RMQ_OUT) $(RMQ_PROTOS)
	sed -i 's/^import \([a-z0-9_]*_pb2\) as /from apache.rocketmq.v2 import \1 as /' \
		$(RMQ_OUT)/*_pb2*.py $(RMQ_OUT)/*_pb2*.pyi
	touch $@

# $(call apt_tool,COMMAND,PACKAGE,WHAT FOR,WHO NEEDS IT): COMMAND, installed with
# apt-get as root when it is missing, else a message saying how.
apt_tool = @command -v $(1) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(2) ($(3)) with apt-get"; \
	    apt-get install -y -q --no-install-recommends $(2) >/dev/null \
	      || { apt-get update -q && apt-get install -y -q --no-install-recommends $(2); }; \
	  else \
	    echo "$(4) needs $(1): sudo apt-get install -y --no-install-recommends $(2)" >&2; \
	    exit 1; \
	  fi; }

tools: etcd apache go-clients  ## what the tests use besides Python: promtool (Debian package prometheus), etcd, Apache RocketMQ's jars, the Go client's programs
	$(call apt_tool,promtool,prometheus,for promtool,make test)

apache: $(APACHE_STAMP)  ## Apache RocketMQ 4.9 and 5.x, its 4.9.8 Java client and the RocketMQ 5 Java SDK from Maven Central (tests/compat), the test oracle and benchmark peer

$(APACHE_STAMP): $(COMPAT_SOURCES)
	$(call apt_tool,java,openjdk-17-jdk-headless,Java 17 to run Apache RocketMQ,make apache)
	$(call apt_tool,mvn,maven,Maven to fetch Apache RocketMQ's jars,make apache)
	@echo "resolving Apache RocketMQ's jars from Maven Central into .cache/rocketmq (the first time takes a few minutes)"
	mvn -q -B -f tests/compat/pom.xml package
	@# The class-data-sharing archive the test programs of the client49 kit start from.
	python3 -m tests.apache archive
	@mkdir -p $(dir $@) && touch $@

go-clients: $(GO_STAMP)  ## the Go RocketMQ clients' programs (tests/compat/go on rocketmq-client-go/v2, tests/compat/go5 on the v5 SDK, from the Go module proxy) in .cache/go/bin

$(GO_STAMP): $(GO_SOURCES)
	$(call apt_tool,go,golang-go,Go to build the Go client's test programs,make go-clients)
	@mkdir -p $(dir $@)
	cd tests/compat/go && GOFLAGS="-mod=mod -buildvcs=false" go build -o $(abspath $(dir $@)) ./cmd/...
	cd tests/compat/go5 && GOFLAGS="-mod=mod -buildvcs=false" go build -o $(abspath $(dir $@)) ./cmd/...
	touch $@

etcd:  ## etcd (Debian package etcd-server: failover's consensus store), via apt-get when missing
	$(call apt_tool,etcd,etcd-server,automatic failover's etcd,ferry)

bench-tools: etcd apache go-clients  ## what the benchmarks need besides Python: redis-server (the Redis peer), via apt-get when missing; Apache RocketMQ and the Go SDK's load generator (the apache section)
	$(call apt_tool,redis-server,redis-server,the benchmarks' Redis peer,make bench)

# Three workers on two cores: with two the machine was ~65% busy (servers starting, JVMs,
# timers); with three it is CPU-bound (90-95% busy), and a fourth gained nothing (fresh
# clones: 15m40s with three, 15m42s with four). Only less CPU makes it shorter now
# (docs/development.md). Modules in the order of tests/durations.py.
TEST_WORKERS ?= 3
test: $(PROTO_STAMP) tools  ## run the whole test suite (what CI runs; TEST_WORKERS=3)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

run: $(PROTO_STAMP) etcd  ## start the 2m-2s-failover topology (and etcd) on loopback until Ctrl-C (TOPOLOGY=, data in ./var)
	$(BIN)/ferry dev --topology $(TOPOLOGY) --data-dir $(DATA_DIR) $(ARGS)

# Rounds per scenario for `make chaos` (make test runs 2).
CHAOS_ROUNDS ?= 20

chaos: $(PROTO_STAMP) etcd  ## the chaos suite, CHAOS_ROUNDS rounds per scenario; report in chaos-report.jsonl
	rm -f chaos-report.jsonl
	status=0; \
	FERRY_CHAOS_ROUNDS=$(CHAOS_ROUNDS) FERRY_CHAOS_REPORT=$(abspath chaos-report.jsonl) \
		$(BIN)/pytest -p no:xdist -q --timeout 900 tests/chaos $(PYTEST_ARGS) || status=$$?; \
	$(PY) -m tests.chaos.report chaos-report.jsonl || status=1; \
	exit $$status

# Hypothesis examples per RPC and per RocketMQ-protocol request code for `make fuzz`
# (make test runs 50).
FUZZ_EXAMPLES ?= 1000

# HA frames, reports and handshakes per side for `make fuzz` (make test runs 2,000).
HA_FUZZ_INPUTS ?= 100000

# Broken RocketMQ-protocol frames per server for `make fuzz` (make test runs 3,000);
# FUZZ_EXAMPLES also sets the well-formed frames per request code.
REMOTING_FUZZ_FRAMES ?= 50000

# Random-bytes connections to the proxy's native gRPC door for `make fuzz` (make test runs 200).
DOOR_FUZZ_CONNECTIONS ?= 5000

fuzz: $(PROTO_STAMP)  ## FUZZ_EXAMPLES random requests per RPC and per RocketMQ-protocol code, HA_FUZZ_INPUTS HA inputs per side, REMOTING_FUZZ_FRAMES broken frames per server, DOOR_FUZZ_CONNECTIONS random connections to the native door (~16 min)
	FERRY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FERRY_HA_FUZZ_INPUTS=$(HA_FUZZ_INPUTS) \
		FERRY_REMOTING_FUZZ_FRAMES=$(REMOTING_FUZZ_FRAMES) \
		FERRY_DOOR_FUZZ_CONNECTIONS=$(DOOR_FUZZ_CONNECTIONS) \
		$(BIN)/pytest -p no:xdist -q -s --timeout 3600 tests/fuzz $(PYTEST_ARGS)

lint: $(PROTO_STAMP)  ## ruff over the Python, rustfmt and clippy over native/
	$(BIN)/ruff check ferry services tests benchmarks
	$(BIN)/ruff format --check ferry services tests benchmarks
	cd native && cargo fmt --check && cargo clippy --quiet --release -- -D warnings

bench: $(PROTO_STAMP) bench-tools  ## run the benchmarks and append the figures to BENCHMARKS.md
	$(PY) -m benchmarks --out BENCHMARKS.md

bench-quick: $(PROTO_STAMP) bench-tools  ## every benchmark as a short smoke run: fails when one cannot run (CI runs it)
	$(PY) -m benchmarks --quick

clean:  ## remove the venv, generated code and caches (not ./var)
	rm -rf $(VENV) .cache/rocketmq .cache/go tests/compat/*/target ferry/v1/*_pb2*.py ferry/v1/*_pb2*.pyi $(RMQ_OUT)/*_pb2*.py $(RMQ_OUT)/*_pb2*.pyi $(PROTO_STAMP) .pytest_cache .ruff_cache *.egg-info native/target
