#!/usr/bin/env bash
# Make sure the browser the browser tier (tests/browser) drives is installed (called by `make test`).
#   chromium   /usr/bin/chromium, from Debian's `chromium` package. Playwright drives it through
#              executable_path; `playwright install` is never run (its browser downloads cannot be fetched here).
# Installs only what is missing, and fails loudly if it cannot: the browser tests fail, never skip, without it.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    echo "[browser] ready ($("$CHROMIUM" --version 2>/dev/null | head -1))"
    exit 0
fi

echo "[browser] installing chromium (apt-get, --no-install-recommends)"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo -n"
    else
        echo "[browser] ERROR: $CHROMIUM missing, not root and no sudo: install it (apt-get install -y --no-install-recommends chromium)" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[browser] ERROR: $CHROMIUM missing and apt-get is not available: install Chromium at $CHROMIUM" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || { echo "[browser] ERROR: apt-get update failed" >&2; exit 1; }
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || { echo "[browser] ERROR: apt-get install chromium failed" >&2; exit 1; }
[ -x "$CHROMIUM" ] || { echo "[browser] ERROR: $CHROMIUM still missing after install" >&2; exit 1; }
echo "[browser] ready ($("$CHROMIUM" --version 2>/dev/null | head -1))"
