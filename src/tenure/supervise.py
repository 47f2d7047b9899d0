"""`tenure up`: one gateway and N workers as supervised child processes on one machine.

Each child runs in its own session, so Ctrl-C reaches only the supervisor, which forwards one SIGTERM to every
child (workers drain: unstarted claims released at once, running jobs finish) and SIGKILLs what is still
alive after the drain timeout. A child that dies while the supervisor is not stopping is restarted with a
growing delay (0.5 s doubling to 10 s, reset after a minute of uptime).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass

from tenure.observability.multiprocess import process_exited

log = logging.getLogger("tenure.up")


@dataclass
class Child:
    """One supervised process and how to start it again."""

    name: str
    argv: list[str]
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    delay: float = 0.5
    restarts: int = 0

    async def start(self, env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.argv, env=env, start_new_session=True)
        self.started = time.monotonic()
        log.info("%s started (pid %d)", self.name, self.proc.pid)


async def supervise(
    *, host: str, port: int, workers: int, inline: bool, env: dict[str, str], drain_timeout_s: float
) -> int:
    """Run until SIGINT / SIGTERM; return 0 after a clean stop."""
    exe = [sys.executable, "-m", "tenure.cli"]
    children = [
        Child(
            "gateway",
            [*exe, "gateway", "--host", host, "--port", str(port), *(["--inline"] if inline else [])],
        )
    ]
    children += [Child(f"worker-{i + 1}", [*exe, "worker"]) for i in range(workers)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    exited: asyncio.Queue[Child] = asyncio.Queue()

    async def watch(child: Child) -> None:
        assert child.proc is not None
        await child.proc.wait()
        process_exited(child.proc.pid)  # its live gauges stop counting in the aggregated /metrics
        await exited.put(child)

    async with asyncio.TaskGroup() as tg:
        watchers: list[asyncio.Task[None]] = []
        for c in children:
            await c.start(env)
            watchers.append(tg.create_task(watch(c)))
        print(
            f"tenure up: gateway on http://{host}:{port}, {workers} worker(s)"
            f"{' + 1 inline' if inline else ''}; Ctrl-C stops everything",
            file=sys.stderr,
            flush=True,
        )
        stopper = tg.create_task(stop.wait())
        while not stop.is_set():
            getter = tg.create_task(exited.get())
            await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                getter.cancel()
                break
            child = getter.result()
            assert child.proc is not None
            log.warning(
                "%s (pid %d) exited with %s; restarting in %.1fs",
                child.name,
                child.proc.pid,
                child.proc.returncode,
                child.delay,
            )
            if time.monotonic() - child.started > 60:
                child.delay = 0.5
            try:
                await asyncio.wait_for(stop.wait(), child.delay)
                break
            except TimeoutError:
                pass
            child.delay = min(child.delay * 2, 10.0)
            child.restarts += 1
            await child.start(env)
            watchers.append(tg.create_task(watch(child)))
        log.info("stopping: SIGTERM to every child, waiting up to %.0fs", drain_timeout_s + 5)
        alive = [c.proc for c in children if c.proc is not None and c.proc.returncode is None]
        for p in alive:
            _signal(p, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in alive)), drain_timeout_s + 5)
        except TimeoutError:
            for p in alive:
                if p.returncode is None:
                    log.warning("pid %d did not stop in time: SIGKILL", p.pid)
                    _signal(p, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in alive))
        for w in watchers:
            w.cancel()
    print("tenure up: stopped", file=sys.stderr, flush=True)
    return 0


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
