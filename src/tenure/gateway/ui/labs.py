"""The live labs: seed 000's three experiments run against the real runtime, started from the dashboard.

A lab is a child process, `python -m tenure.demos.labs NAME --dir DIR --params JSON` (src/tenure/labs), that makes a
throw-away SQLite store in DIR, starts real `tenure worker` processes on it with the bundled lab agents, drives
them through the public API and prints one JSON object a line: what it measured (`sample`), what happened
(`event`), and its conclusion (`result`). This module only runs that process and relays its lines to the page
over SSE; it imports nothing of the lab (the gateway layer never sees the backends the lab uses).

Bounds: one lab at a time per gateway; each declares its duration and is killed `GRACE_S` after it (the lab
stops itself first); the child and every worker it starts share one process group, which is SIGKILLed when the
lab ends however it ends, and DIR is removed. Starting a lab starts processes on the gateway's machine, so only
the admin may (or anyone on a loopback gateway without keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response, StreamingResponse

log = logging.getLogger("tenure.gateway.labs")

GRACE_S = 30.0
MAX_LINES = 20_000


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a lab, as its form shows it and as `start` checks it."""

    name: str
    label: str
    default: float
    lo: float
    hi: float
    step: float = 1.0

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ValueError(f"{self.name} must be a number")
        if not self.lo <= value <= self.hi:
            raise ValueError(f"{self.name} must be from {self.lo:g} to {self.hi:g}")
        return float(value) if self.step < 1 else float(int(value))


@dataclass(frozen=True, slots=True)
class Lab:
    """A lab of the catalog."""

    name: str
    title: str
    question: str
    what: str
    params: tuple[Param, ...]
    seconds: float  # its longest run

    def check(self, params: Mapping[str, Any]) -> dict[str, float]:
        unknown = set(params) - {p.name for p in self.params}
        if unknown:
            raise ValueError(f"unknown parameters: {', '.join(sorted(unknown)[:5])}")
        return {p.name: p.check(params.get(p.name, p.default)) for p in self.params}


CATALOG: tuple[Lab, ...] = (
    Lab(
        "loop",
        "Where the work runs",
        "What does blocking work on the event loop cost a worker, and what does ctx.to_thread change?",
        "One worker runs the same synchronous work twice: first through ctx.to_thread, then on its event loop "
        "(time.sleep in the handler). The chart plots the worker's own measured loop lag and its late heartbeats, read "
        "from its /metrics while it works.",
        (
            Param("jobs", "jobs at once", 4, 1, 8),
            Param("block_ms", "each block (ms)", 300, 50, 1000),
            Param("blocks", "blocks per job", 6, 1, 20),
        ),
        60,
    ),
    Lab(
        "owner",
        "Who owns the job",
        "Does a short job wait behind a busy worker? What happens to a claim whose worker freezes before it starts?",
        "Three workers with one slot each. A long job keeps W1 busy while short jobs arrive: watch them start on the "
        "idle workers. Then W3 claims a job and freezes before its start (the fault hook TENURE_FAULTS="
        "after_claim@lab_victim=stop, two-step claims): its claim expires, another worker claims the job at a higher "
        "epoch and runs it, and when W3 wakes up its late start is refused.",
        (Param("short_jobs", "short jobs", 6, 1, 20),),
        60,
    ),
    Lab(
        "lease",
        "Counter versus lease",
        "What happens to a quota when its holders crash?",
        "Workers run jobs that each hold a slot of the quota lab:pool, and some of them SIGKILL their own process while "
        "holding it. The real quota is made of leases in the store: a dead holder's slot expires within one TTL. A "
        "naive counter (INCR on acquire, DECR on release; simulated from the same jobs) never sees the release of a "
        "crashed holder and leaks a slot each time.",
        (
            Param("limit", "quota limit", 4, 1, 8),
            Param("crash_rate", "crash rate", 0.3, 0.0, 0.8, 0.05),
            Param("seconds", "duration (s)", 20, 8, 40),
        ),
        60,
    ),
)


@dataclass
class LabRun:
    """One run of a lab: its child process, its directory and the lines it printed."""

    id: str
    name: str
    params: dict[str, float]
    directory: str
    started: float = field(default_factory=time.time)
    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return not self.done.is_set()


class LabRunner:
    """Runs at most one lab at a time and keeps the last run of each lab for its page."""

    def __init__(self, python: str = sys.executable, env: Mapping[str, str] | None = None) -> None:
        self._python = python
        base = dict(os.environ if env is None else env)
        # A lab configures its own processes: none of the gateway's settings (keys, store, quotas) leak into them.
        self._env = {k: v for k, v in base.items() if not k.startswith("TENURE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
        self._runs: dict[str, LabRun] = {}
        self._lock = asyncio.Lock()
        self._count = 0

    def catalog(self) -> list[Lab]:
        return list(CATALOG)

    def lab(self, name: str) -> Lab | None:
        return next((lab for lab in CATALOG if lab.name == name), None)

    def current(self) -> LabRun | None:
        return next((r for r in self._runs.values() if r.running), None)

    def last(self, name: str) -> LabRun | None:
        return self._runs.get(name)

    async def start(self, name: str, params: Mapping[str, Any]) -> LabRun:
        """Start lab `name` (LookupError: no such lab; ValueError: bad parameters; RuntimeError: one is running)."""
        lab = self.lab(name)
        if lab is None:
            raise LookupError(f"there is no lab {name[:40]!r}")
        checked = lab.check(params)
        async with self._lock:
            busy = self.current()
            if busy is not None:
                raise RuntimeError(f"the lab {busy.name!r} is running; one lab at a time")
            self._count += 1
            directory = await asyncio.to_thread(tempfile.mkdtemp, prefix=f"tenure-lab-{name}-")
            run = LabRun(f"{name}-{self._count}", name, checked, directory)
            argv = [self._python, "-m", "tenure.demos.labs", name, "--dir", directory, "--params", json.dumps(checked)]
            run.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: the lab and every worker it starts
                cwd=directory,
            )
            self._runs[name] = run
            # One task per run, awaited by `stop` / `close`: it reads the lab's lines, bounds its time and cleans up.
            run.task = asyncio.create_task(self._watch(run, lab.seconds + GRACE_S), name=f"lab-{run.id}")
            log.info("lab %s started (pid %d) in %s", run.id, run.proc.pid, directory)
            return run

    async def _watch(self, run: LabRun, limit_s: float) -> None:
        proc = run.proc
        assert proc is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(limit_s):
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        break
                    if len(run.lines) < MAX_LINES:
                        text = line.decode("utf-8", "replace").strip()
                        if text.startswith("{"):
                            run.lines.append(text)
                        else:  # a traceback or a stray print: shown as a log line of the lab
                            run.lines.append(json.dumps({"kind": "log", "text": text[:2000]}))
                        run.changed.set()
                await proc.wait()
        except TimeoutError:
            run.lines.append(json.dumps({"kind": "error", "text": f"the lab ran over {limit_s:g} s and was stopped"}))
        finally:
            await self._end(run)

    async def _end(self, run: LabRun) -> None:
        proc = run.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the lab and whatever of its workers is still alive
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 10)
            run.returncode = proc.returncode
        await asyncio.to_thread(shutil.rmtree, run.directory, True)
        run.lines.append(json.dumps({"kind": "end", "returncode": run.returncode}))
        run.done.set()
        run.changed.set()
        log.info("lab %s ended (%s); removed %s", run.id, run.returncode, run.directory)

    async def stop(self, name: str) -> bool:
        """Stop lab `name` if it runs: SIGTERM to the lab (it stops its workers), SIGKILL of the group after 5 s."""
        run = self._runs.get(name)
        if run is None or not run.running or run.proc is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.done.wait(), 5)
        if run.running and run.task is not None:
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task
        return True

    async def close(self) -> None:
        """Stop every lab (the gateway is stopping)."""
        for name in list(self._runs):
            await self.stop(name)

    def stream(self, name: str, last_event_id: str | None) -> Response:
        """The lines of the last run of lab `name` as SSE (`id` = line number), live until it ends; 204 once a
        reconnect has nothing left to read (EventSource then stops)."""
        run = self._runs.get(name)
        try:
            start = int(last_event_id) + 1 if last_event_id else 0
        except ValueError:
            start = 0
        if run is None or (not run.running and start >= len(run.lines)):
            return Response(status_code=204)

        async def lines() -> AsyncIterator[str]:
            i = start
            yield f": lab {run.id}\n\n"
            while True:
                run.changed.clear()
                while i < len(run.lines):
                    yield f"id: {i}\ndata: {run.lines[i]}\n\n"
                    i += 1
                if not run.running and i >= len(run.lines):
                    return
                try:
                    await asyncio.wait_for(run.changed.wait(), 5)
                except TimeoutError:
                    yield ": keep-alive\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
