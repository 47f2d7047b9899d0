"""`tenure up`: one gateway and N workers as supervised child processes on one machine.

Each child runs in its own session, so Ctrl-C reaches only the supervisor, which forwards one SIGTERM to every
child (workers drain: unstarted claims released at once, running jobs finish) and SIGKILLs what is still
alive after the drain timeout. A child that dies while the supervisor is not stopping — a crash, an OOM kill,
a SIGKILL — is started again after its own backoff (`Backoff`: 1 s doubling to 30 s, each wait multiplied by a
random factor in [0.5, 1.0] — the jittered backoff of `control/retry.py` that a worker's registration uses too —
reset after a minute of uptime). A worker that exits 0 drained (`tenure drain`, or a SIGTERM sent to it alone)
and is not started again. Each child is watched by a task of its own, so one child waiting out a long backoff
never delays the restart of another (a crash-looping worker must not keep the gateway, or the other workers, down).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tenure.control.retry import REGISTER_CAP_S, REGISTER_FIRST_S, backoff_s
from tenure.observability.multiprocess import process_exited

log = logging.getLogger("tenure.up")


@dataclass
class Backoff:
    """How long a dead child waits before it is started again: `first_s`, doubling up to `max_s` while it keeps
    dying, each wait multiplied by a random factor in [0.5, 1.0] (`control.retry.backoff_s`); a child that had
    been up for `reset_after_s` when it died starts over from `first_s` (one crash a day is not a crash loop)."""

    first_s: float = REGISTER_FIRST_S
    max_s: float = REGISTER_CAP_S
    reset_after_s: float = 60.0
    rng: random.Random | None = None
    deaths: int = field(default=0, init=False)
    """Deaths in a row (since the last reset)."""

    def delay_after(self, uptime_s: float) -> float:
        """The delay before the next start of a child that died after `uptime_s` seconds of running."""
        if uptime_s >= self.reset_after_s:
            self.deaths = 0
        self.deaths += 1
        return backoff_s(self.deaths, self.first_s, self.max_s, self.rng)


@dataclass
class Child:
    """One supervised process and how to start it again."""

    name: str
    argv: list[str]
    backoff: Backoff = field(default_factory=Backoff)
    drains: bool = False
    """A worker: exiting 0 means it drained (`tenure drain`, a SIGTERM of its own), so it is not started again."""
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0

    async def start(self, env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.argv, env=env, start_new_session=True)
        self.started = time.monotonic()
        log.info("%s started (pid %d)", self.name, self.proc.pid)


async def supervise(*, host: str, port: int, workers: int, inline: bool, env: dict[str, str], drain_timeout_s: float) -> int:
    """Run until SIGINT / SIGTERM; return 0 after a clean stop."""
    exe = [sys.executable, "-m", "tenure.cli"]
    children = [
        Child(
            "gateway",
            [*exe, "gateway", "--host", host, "--port", str(port), *(["--inline"] if inline else [])],
        )
    ]
    children += [Child(f"worker-{i + 1}", [*exe, "worker"], drains=True) for i in range(workers)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        print(
            f"tenure up: gateway on http://{host}:{port}, {workers} worker(s)"
            f"{' + 1 inline' if inline else ''}; Ctrl-C stops everything",
            file=sys.stderr,
            flush=True,
        )

    await run_children(children, env, stop, kill_after_s=drain_timeout_s + 5, on_started=ready)
    print("tenure up: stopped", file=sys.stderr, flush=True)
    return 0


async def run_children(
    children: Sequence[Child],
    env: dict[str, str],
    stop: asyncio.Event,
    *,
    kill_after_s: float,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Start every child, keep each one running (restarting it after its backoff) until `stop` is set, then
    SIGTERM every child and SIGKILL those still alive `kill_after_s` later. Returns when all have exited."""
    for child in children:
        await child.start(env)
    if on_started is not None:
        on_started()
    async with asyncio.TaskGroup() as tg:
        for child in children:
            tg.create_task(_keep_running(child, env, stop, kill_after_s), name=f"supervise-{child.name}")
        await stop.wait()
        log.info("stopping: SIGTERM to every child, waiting up to %.0fs", kill_after_s)


async def _keep_running(child: Child, env: dict[str, str], stop: asyncio.Event, kill_after_s: float) -> None:
    """One child's life under the supervisor: wait for it to exit or for `stop`; restart it after its backoff."""
    while True:
        proc = child.proc
        if proc is not None:
            if not await _exited_before(proc, stop):
                await _terminate(proc, kill_after_s)
                process_exited(proc.pid)
                return
            process_exited(proc.pid)  # its live gauges stop counting in the aggregated /metrics
            if stop.is_set():
                return
            if child.drains and proc.returncode == 0:
                log.info("%s (pid %d) drained and exited 0: not restarting it", child.name, proc.pid)
                return
            what = f"{child.name} (pid {proc.pid}) exited with {proc.returncode}"
        else:
            what = f"{child.name} could not be started"
        delay = child.backoff.delay_after(time.monotonic() - child.started)
        log.warning("%s; restarting in %.1fs", what, delay)
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return
        except TimeoutError:
            pass
        child.restarts += 1
        try:
            await child.start(env)
        except OSError as exc:  # fork or exec failed (out of memory, too many processes): try again later
            log.error("%s: starting failed: %s", child.name, exc)
            child.proc = None
            child.started = time.monotonic()


async def _exited_before(proc: asyncio.subprocess.Process, stop: asyncio.Event) -> bool:
    """Wait until the process exits (True) or `stop` is set (False), whichever comes first."""
    async with asyncio.TaskGroup() as tg:
        exited = tg.create_task(proc.wait())
        stopping = tg.create_task(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        stopping.cancel()
    return proc.returncode is not None


async def _terminate(proc: asyncio.subprocess.Process, kill_after_s: float) -> None:
    """SIGTERM the child's session, then SIGKILL it if it is still alive after `kill_after_s`."""
    _signal(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), kill_after_s)
    except TimeoutError:
        log.warning("pid %d did not stop in time: SIGKILL", proc.pid)
        _signal(proc, signal.SIGKILL)
        await proc.wait()


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
