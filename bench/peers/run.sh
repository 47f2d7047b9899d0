#!/usr/bin/env bash
# Tenure beside the peers: ./bench/peers/run.sh [any peersbench option]
#   e.g. ./bench/peers/run.sh --peers tenure-pg,tenure-sqlite,saq,procrastinate --workloads W1,W2 --reps 1 --quick
#
# 1. copies the (read-only) harness /work/shared/bench-peers to a fresh temp dir,
# 2. drops bench/peers/tenure_peer.py in as peersbench/peers/tenure_peer.py and registers its drivers,
# 3. makes sure the harness venv exists (as the harness's run.sh would) and installs this checkout of
#    tenure into it (pip install -e), so `tenure worker` runs from the venv the harness runs in,
# 4. runs the harness's own run.sh (pinned requirements, services.sh, python -m peersbench), writing
#    results<tag>.json / .md into bench/peers/results/ (a --quick run defaults to --tag=-quick).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT="$(cd "$HERE/../.." && pwd)"
HARNESS="${PEERS_HARNESS:-/work/shared/bench-peers}"
VENV="${PEERS_VENV:-/tmp/peersenv}"
RESULTS="${PEERS_RESULTS:-$HERE/results}"

WORK="$(mktemp -d /tmp/tenure-peersbench.XXXXXX)"
[ -n "${PEERS_KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT   # PEERS_KEEP=1 keeps the harness copy
cp -r "$HARNESS"/. "$WORK"/
chmod -R u+w "$WORK"
rm -f "$WORK"/results*.json "$WORK"/results*.md   # the harness's own last results are not ours
cp "$HERE/tenure_peer.py" "$WORK/peersbench/peers/tenure_peer.py"
"${PYTHON:-python3}" - "$WORK/peersbench/peers/__init__.py" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
lines = (
    '    "tenure-pg": "peersbench.peers.tenure_peer:Driver",\n'
    '    "tenure-sqlite": "peersbench.peers.tenure_peer:SqliteDriver",\n'
    '    "tenure-sqlite-normal": "peersbench.peers.tenure_peer:SqliteNormalDriver",\n'
)
anchor = "REGISTRY = {\n"
if anchor not in text:
    sys.exit(f"{path}: no 'REGISTRY = {{' line to extend")
open(path, "w").write(text.replace(anchor, anchor + lines, 1))
EOF

# Same venv creation as the harness's run.sh; it then installs the pinned requirements itself.
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
if ! "$VENV/bin/pip" install -q --disable-pip-version-check -e "$PROJECT" >/tmp/tenure-peersbench-pip.log 2>&1; then
    cat /tmp/tenure-peersbench-pip.log >&2
    exit 1
fi

tag=()
case " $* " in
    *" --tag"*) ;;
    *" --quick "*) tag=(--tag=-quick) ;;
esac
mkdir -p "$RESULTS"
echo "[tenure-peers] harness copy: $WORK; results: $RESULTS"
export PEERS_VENV="$VENV"
"$WORK/run.sh" --out "$RESULTS" "${tag[@]}" "$@"
