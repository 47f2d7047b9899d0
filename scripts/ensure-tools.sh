#!/usr/bin/env bash
# Make sure the command-line tools the test suite needs are installed (called by `make test`).
#   promtool   checks and unit-tests deploy/prometheus/alerts.yml; from Debian's `prometheus` package.
# Installs only what is missing, and fails loudly if it cannot.
set -euo pipefail

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)

if [ ${#need_apt[@]} -eq 0 ]; then
    echo "[tools] ready"
    exit 0
fi

echo "[tools] installing ${need_apt[*]} (apt-get, --no-install-recommends)"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo -n"
    else
        echo "[tools] ERROR: ${need_apt[*]} missing, not root and no sudo: install them (apt-get install -y --no-install-recommends ${need_apt[*]})" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[tools] ERROR: ${need_apt[*]} missing and apt-get is not available: install promtool (https://prometheus.io/download/) and put it on PATH" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || { echo "[tools] ERROR: apt-get update failed" >&2; exit 1; }
$SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null \
    || { echo "[tools] ERROR: apt-get install ${need_apt[*]} failed" >&2; exit 1; }
# The package starts a Prometheus server where an init system runs; the tests need only promtool.
command -v promtool >/dev/null 2>&1 || { echo "[tools] ERROR: promtool still missing after install" >&2; exit 1; }
echo "[tools] ready ($(promtool --version 2>&1 | head -1))"
