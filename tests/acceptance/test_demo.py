"""Acceptance: `python -m tenure.demos.demo` (the program behind `make demo`) tells its whole story, exits 0, and
leaves no `tenure worker` process behind.

The demo is run exactly as a user runs it: a separate process, real worker subprocesses, one SQLite file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DEMO_TIMEOUT_S = 120


def _cmdline(pid: int) -> bytes | None:
    """The command line of a live (not zombie) process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (the demo passes its database URL to each worker)."""
    needle = text.encode()
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != os.getpid() and needle in (_cmdline(int(p.name)) or b"")
    ]


def _is_tenure_worker(pid: int) -> bool:
    cmd = _cmdline(pid)
    return cmd is not None and b"tenure" in cmd and b"worker" in cmd


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_tells_the_story_and_leaves_no_worker_behind() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure.demos.demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    timed_out = False
    try:
        out_bytes, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # the demo kills its workers' process groups on SIGTERM
        try:
            out_bytes, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out_bytes, _ = proc.communicate()
    out = out_bytes.decode(errors="replace")

    store = re.search(r"store\s+sqlite:///(\S+)", out)
    pids = [int(p) for _, p in re.findall(r"started worker (W\d): pid (\d+)", out)]
    by_path = _processes_mentioning(store.group(1)) if store else []
    survivors = sorted({p for p in pids if _is_tenure_worker(p)} | set(by_path))
    _kill(survivors)  # never leak processes into the rest of the run, even when failing

    assert not timed_out, f"the demo did not finish within {DEMO_TIMEOUT_S}s:\n{out}"
    assert proc.returncode == 0, f"the demo exited {proc.returncode}:\n{out}"
    assert store is not None, out
    assert len(pids) == 4, f"expected 4 worker pids in the output (W4 replaces the worker killed in 4b):\n{out}"
    assert not survivors, f"worker processes survived the demo: {survivors}\n{out}"

    # Short jobs went to idle workers at once while W1 was busy with the long job.
    assert "W1 is still running long" in out, out
    assert re.search(r"short-\d+\s+\w+\s+-> W3\s+claimed after \d+ ms, NOT started", out), out

    # The claim W3 never started was claimed again, by another worker, with a higher epoch.
    reclaim = re.search(r"(short-\d+) claimed by (W\d) at epoch (\d+) \(was (\d+)\)", out)
    assert reclaim is not None, out
    label, by = reclaim.group(1), reclaim.group(2)
    new_epoch, old_epoch = int(reclaim.group(3)), int(reclaim.group(4))
    assert by != "W3" and new_epoch > old_epoch, reclaim.group(0)
    assert re.search(rf"^{label}\s+\w+\s+succeeded\s+{new_epoch}\s", out, re.M), out

    # The started job of a killed worker became lost, and its side effect happened exactly once.
    assert "the sweeper marked crash lost (owner_lost)" in out, out
    assert re.search(r"state lost, epoch 1, 1 execution, counter file = 1\b", out), out
    # 4b: a retry-safe journaled job killed inside a step is requeued and resumes, each effect once
    assert re.search(r"journaled succeeded at epoch 2 after 2 attempts; executions: W\d lost @1, W4 succeeded @2", out), out
    assert "journal.txt = fetch publish notify  (each step's effect once)" in out, out
    assert "step.unknown" in out, out
    # step 6: the gateway, two workers and the mock model under a quota of 4
    assert re.search(
        r"(\d+) of \1 chat jobs succeeded; the mock model saw \d+ requests, at most [1-4] at once, "
        r"and answered 429 0 times",
        out,
    ), out
    assert re.search(r"\d+ events, streamed tokens: '.+'", out), out
    assert "`tenure up` and the mock model stopped cleanly" in out, out
    assert re.search(r"^crash\s+crash_after_effect\s+lost\s+1\s", out, re.M), out
    assert re.search(r"^long\s+sleep\s+succeeded\s+1\s", out, re.M), out

    assert "demo finished: every step behaved as described." in out, out
