# Everything a fresh Debian machine with Python 3.11 needs is installed by these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint proto bench-tta bench-gpu clean

demo: $(STAMPS)/python-deps $(STAMPS)/system-deps
	$(BIN)/poirotd demo

test: $(STAMPS)/python-deps $(STAMPS)/system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Skips the slow integration tests (real daemon process, embedded model).
test-fast: $(STAMPS)/python-deps $(STAMPS)/system-deps
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMPS)/python-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy poirotd poirot_eval hwbridge tests bench

proto: $(STAMPS)/python-deps
	$(BIN)/python -m poirotd.api.codegen

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# llama-cpp-python compiles llama.cpp on first install (several minutes on 2 cores); pip caches the wheel.
$(STAMPS)/python-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[embedded,dev,eval]'
	@mkdir -p $(STAMPS) && touch $@

# Real parts the tests start on loopback ports of their own: Mosquitto (and mosquitto_sub for the
# edge healthcheck), Prometheus and promtool, a PostgreSQL server (the tests run initdb and
# postgres from /usr/lib/postgresql/*/bin in a temporary folder; the package's own cluster is not
# used); openssl for deploy/edge/make-certs.sh.
$(STAMPS)/system-deps:
	@if ! command -v mosquitto >/dev/null || ! command -v mosquitto_sub >/dev/null \
	    || ! command -v promtool >/dev/null || ! command -v openssl >/dev/null \
	    || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    mosquitto mosquitto-clients prometheus openssl postgresql; \
	fi
	@mkdir -p $(STAMPS) && touch $@

# poirotd against poirot-framework 0.2.0 (own venv, made on first use) on Who&When: about an hour.
# The cases come from POIROTD_EVAL_DATA, the data folder holding whowhen/ (README.md: Evaluation).
bench-tta: $(STAMPS)/python-deps
	$(BIN)/python -m bench.tta

# Every method over every benchmark against a vLLM server (docs/bench-gpu.md); run it again to
# resume. E.g. make bench-gpu VLLM_URL=http://gpu-host:8000/v1 MODEL=Qwen/Qwen2.5-7B-Instruct
BENCH_GPU_ARGS ?=
bench-gpu: $(STAMPS)/python-deps
	@test -n "$(VLLM_URL)" -a -n "$(MODEL)" || { echo "usage: make bench-gpu VLLM_URL=... MODEL=..."; exit 2; }
	$(BIN)/python -m bench.gpu --base-url "$(VLLM_URL)" --model "$(MODEL)" $(BENCH_GPU_ARGS)

clean:
	rm -rf $(VENV) $(STAMPS) .pytest_cache .mypy_cache .ruff_cache
