#!/usr/bin/env bash
# Make sure the command-line tools the test suite needs are installed (called by `make test`).
#   promtool   checks and unit-tests deploy/prometheus/alerts.yml; from Debian's `prometheus` package.
#   ip         (iproute2) and nft (nftables): tests/integration/test_hosts.py puts gateways and workers in
#              network namespaces of their own, cuts their links and partitions them from Redis.
# Installs only what is missing, and fails loudly if it cannot.
set -euo pipefail

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)

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
    echo "[tools] ERROR: ${need_apt[*]} missing and apt-get is not available: install them (promtool: https://prometheus.io/download/, ip: iproute2, nft: nftables) and put them on PATH" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || { echo "[tools] ERROR: apt-get update failed" >&2; exit 1; }
$SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null \
    || { echo "[tools] ERROR: apt-get install ${need_apt[*]} failed" >&2; exit 1; }
# The package starts a Prometheus server where an init system runs; the tests need only promtool.
for tool in promtool ip nft; do
    command -v "$tool" >/dev/null 2>&1 || { echo "[tools] ERROR: $tool still missing after install" >&2; exit 1; }
done
echo "[tools] ready ($(promtool --version 2>&1 | head -1); $(ip -V); $(nft --version))"
