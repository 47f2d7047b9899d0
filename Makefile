# Tenure — the two commands of the README contract:
#   make demo   create the virtualenv, install, run the demo on the embedded default (SQLite, no service)
#   make test   install the dev dependencies, make sure PostgreSQL and Redis answer, run the whole suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test install dev services tools browser lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(PIP) install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

dev: $(VENV)/.installed-dev

# `make demo UI=1` ends by leaving a `tenure up` running and printing its dashboard URL.
demo: install
	$(PY) -m tenure.demos.demo $(if $(UI),--ui,)

services:
	scripts/ensure-services.sh

# promtool (Debian's `prometheus` package) for the alert-rule tests, ip (iproute2) and nft (nftables) for the
# network-namespace tests (tests/integration/test_hosts.py); each installed only if missing.
tools:
	scripts/ensure-tools.sh

# Chromium (Debian's `chromium` package, /usr/bin/chromium) for tests/browser; installed only if missing.
browser:
	scripts/ensure-browser.sh

lint: dev
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

test: dev services tools browser lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: dev services
	$(PY) bench/claim.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache tenure.db*
