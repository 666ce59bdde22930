# Two commands on a fresh machine:  `make demo` (the local cluster on CPU) and `make test`.
# Every target sets up what it needs, idempotently, into .venv with pip (uv/poetry would fetch a CUDA torch).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ardiff-installed
# pip's "Location ... is ignored" lines come from this machine's pip config, not from us.
QUIET_PIP := grep -v -e 'is ignored: it is neither a file nor a directory' || true
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: help packages kubernetes setup test lint format demo up down clean

help:
	@echo "make demo    run the whole system locally on CPU (dev cluster, real workers, MP4s in ./demo-out)"
	@echo "make test    set up .venv, then ruff + pytest (CPU; GPU tests are deselected)"
	@echo "make up      keep the local cluster running in the background (make down stops it)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 2>&1 | $(QUIET_PIP)

# Re-installs only when pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[worker,operator,client,test]' 2>&1 | $(QUIET_PIP)
	touch $@

# Debian packages: Redis for the placement store; iptables and conntrack for kube-proxy (in the dev cluster's
# node namespaces); Chromium and its driver for the viewer's browser test; containerd, runc, the CNI plugins,
# umoci and a static busybox for the real node, buildah and debootstrap for the images built from the Dockerfiles
# (issue 39); Prometheus for `promtool`, which checks and unit-tests the chart's alerting rules (issue 40).
packages: $(STAMP)
	@command -v redis-server >/dev/null && command -v chromium >/dev/null && command -v chromedriver >/dev/null && \
		command -v iptables >/dev/null && command -v conntrack >/dev/null && command -v containerd >/dev/null && \
		command -v runc >/dev/null && command -v umoci >/dev/null && test -x /usr/lib/cni/bridge && \
		dpkg -s busybox-static >/dev/null 2>&1 && command -v buildah >/dev/null && command -v debootstrap >/dev/null && \
		command -v promtool >/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server chromium \
			chromium-driver iptables conntrack containerd runc umoci containernetworking-plugins busybox-static \
			buildah debootstrap && \
		$(SUDO) apt-get install -y -q --no-install-recommends prometheus; }
	$(BIN)/python -m ardiff.devcluster.binaries --helm $(BIN) --envoy

# The dev cluster's Kubernetes (kube-apiserver, controller-manager, scheduler, kube-proxy, kubelet, etcd, CoreDNS)
# built from Go modules into ~/.cache/ardiff/kubernetes/: about 15 minutes the first time on 2 cores, then nothing.
kubernetes: packages
	$(BIN)/python -m ardiff.devcluster.binaries --kubernetes

setup: packages kubernetes

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: setup lint
	$(BIN)/pytest $(PYTEST_ARGS)

demo: setup
	$(BIN)/ardiff demo

# The local cluster in the background (state, logs and kubeconfig in .ardiff-dev/); `up` prints how to use it.
up: setup
	$(BIN)/ardiff up

down:
	$(BIN)/ardiff down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
