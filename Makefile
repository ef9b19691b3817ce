# Everything a fresh Debian machine with Python 3.11 needs is installed by these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint proto bench-tta clean

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
# xgrammar (vLLM's default structured-output engine, at vLLM 0.10.1.1's pin) without its declared
# torch, transformers and triton: the grammar checks use its compiled core only, which needs none
# of them (docs/vllm-grammars.md). 12 MB download, 34 MB installed.
XGRAMMAR := xgrammar==0.1.21

$(STAMPS)/python-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[embedded,dev,eval]'
	$(BIN)/python -m pip install --quiet --no-deps '$(XGRAMMAR)'
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

clean:
	rm -rf $(VENV) $(STAMPS) .pytest_cache .mypy_cache .ruff_cache
