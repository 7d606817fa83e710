# pd-operator developer entry points. Every target installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install system-deps test test-fast demo crds plan bench lint verify clean

# Mooncake's wheel links libibverbs even on machines without RDMA hardware.
system-deps:
	@if ! ldconfig -p | grep -q libibverbs.so.1; then \
	  echo "installing libibverbs1 (needed by the Mooncake transfer engine)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  ($$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libibverbs1) >/dev/null; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: system-deps $(STAMP)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not integration and not faults and not transfer and not vllm" $(PYTEST_ARGS)

demo: install
	$(PY) -m pd_operator.demo examples/glm-5.3-flash-tp8-dp2tp4.yaml

plan: install
	$(VENV)/bin/pdctl plan examples/glm-5.3-flash-tp8-dp2tp4.yaml

bench: install
	$(PY) bench/plan.py

lint: install
	$(VENV)/bin/ruff check operator tests bench
	$(VENV)/bin/mypy operator/pd_operator

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
