# Everything a fresh Debian machine with Python 3.11 needs is installed by these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
PHOENIX_VENV := .venv-phoenix
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint docs docs-reference proto bench-tta bench-gpu clean

demo: $(STAMPS)/python-deps $(STAMPS)/system-deps
	$(BIN)/poirotd demo

test: $(STAMPS)/python-deps $(STAMPS)/system-deps $(STAMPS)/phoenix-venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Skips the slow integration tests (real daemon process, embedded model).
test-fast: $(STAMPS)/python-deps $(STAMPS)/system-deps
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMPS)/python-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy poirotd poirot_eval hwbridge tests bench docs/tooling

# The documentation site (mkdocs.yml, docs/) into site/; strict: any warning (a broken link, an
# anchor or page that does not exist) fails the build.
docs: $(STAMPS)/python-deps
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# docs/reference/*.md from the code: settings, spec, wire API, metrics, CLI
# (tests/docs/test_reference.py fails when they are stale).
docs-reference: $(STAMPS)/python-deps
	$(BIN)/python docs/tooling/reference.py

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
# used); openssl for deploy/edge/make-certs.sh; Chromium and its chromedriver for the page's
# browser tests (Selenium drives /usr/bin/chromedriver: no browser is downloaded).
$(STAMPS)/system-deps:
	@if ! command -v mosquitto >/dev/null || ! command -v mosquitto_sub >/dev/null \
	    || ! command -v promtool >/dev/null || ! command -v openssl >/dev/null \
	    || ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null \
	    || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    mosquitto mosquitto-clients prometheus openssl postgresql chromium chromium-driver; \
	fi
	@mkdir -p $(STAMPS) && touch $@

# Arize Phoenix, which the slow OTLP-export test (tests/exporters/test_phoenix.py) starts and
# queries, in a venv of its own: its OpenTelemetry and web stack would clash with the project's
# pins. About 6 minutes and 850 MB on first use (docs/otlp-export.md).
$(STAMPS)/phoenix-venv: tests/support/phoenix-requirements.txt
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet -r tests/support/phoenix-requirements.txt
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
	rm -rf $(VENV) $(PHOENIX_VENV) $(STAMPS) .pytest_cache .mypy_cache .ruff_cache site
