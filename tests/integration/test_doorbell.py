"""SQLite's doorbells (backends/sqlite/doorbell.py): a commit in one process that makes a job claimable, or
sends a command, wakes the waiters of other processes at once, not at their next poll.

Each test stretches the poll it is about to 60 s, so only the doorbell can wake the waiter within the test's
20 s; the other process is a real `tenure` CLI process with its own connection. Without inotify the poll alone
still finds the job (the doorbell is an accelerator, never the only way)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from tenure.backends.sqlite import doorbell
from tenure.backends.sqlite import signals as sqlite_signals
from tenure.contracts.store import Backends, Store
from tests.conftest import PYTHON, ROOT
from tests.contract.test_store import submit

T = TypeVar("T")
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # `store` on SQLite only

POLL_S = 60.0
WAKE_WITHIN_S = 20.0


async def cli(database_url: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(TENURE_DATABASE_URL=database_url, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-m", "tenure.cli", *args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    return out.decode().strip()


async def woken_by(wait: Awaitable[T], other_process: Awaitable[object]) -> T:
    """Start `wait`, see that it waits, let the other process commit, and return what `wait` returns."""
    waiting = asyncio.ensure_future(wait)
    await asyncio.sleep(0.2)
    assert not waiting.done(), "woken before the other process did anything"
    await other_process
    return await asyncio.wait_for(waiting, WAKE_WITHIN_S)


async def test_a_submit_in_another_process_wakes_a_waiting_worker(
    store: Store, backends: Backends, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = backends.signals
    monkeypatch.setattr(sqlite_signals, "_POLL_MIN_S", POLL_S)
    monkeypatch.setattr(sqlite_signals, "_POLL_MAX_S", POLL_S)
    for round_ in range(3):
        # Takes note of the database's current version: a wait that follows a wake-up may otherwise return at
        # once for the commit that rang (as a worker's does; it then finds nothing to claim).
        await signals.wait_for_jobs(0)
        submitted = cli(database_url, "submit", "echo", "--input", f'{{"round": {round_}}}')
        await woken_by(signals.wait_for_jobs(2 * POLL_S), submitted)
        [(claim, _)] = await store.claim_and_start("w", ["echo"], [], 5, 30)
        assert json.loads(claim.input_json) == {"round": round_}


async def test_a_cancel_in_another_process_wakes_the_jobs_owner(
    store: Store, backends: Backends, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = backends.signals
    monkeypatch.setattr(sqlite_signals, "_CONTROL_POLL_S", POLL_S)
    job_id = await submit(store, "echo", {})
    [(claim, _)] = await store.claim_and_start("w", ["echo"], [], 1, 30)
    assert await signals.wait_for_control(0) == frozenset()  # takes note of the current version
    cancelled_elsewhere = cli(database_url, "cancel", job_id)
    assert await woken_by(signals.wait_for_control(2 * POLL_S), cancelled_elsewhere) is None  # "check your jobs"
    cancelled, _ = await store.control_state([claim.fence.job_id])
    assert cancelled == {job_id}


async def test_without_inotify_the_poll_still_finds_the_job(
    store: Store, backends: Backends, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = backends.signals
    monkeypatch.setattr(doorbell, "_LIBC", None)  # read when the store first waits
    await signals.wait_for_jobs(0)
    # Woken by the default poll, at most 25 ms after the commit.
    await woken_by(signals.wait_for_jobs(2 * POLL_S), cli(database_url, "submit", "echo", "--input", "{}"))
    assert len(await store.claim_and_start("w", ["echo"], [], 5, 30)) == 1
