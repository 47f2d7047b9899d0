"""The demo's machinery: worker processes in their own process groups, the jobs it tracks, its output, the
probes its steps wait on (tenure.demos.demo runs the steps)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tenure
from tenure.contracts.states import JobState
from tenure.contracts.types import Event, Execution, Job, WorkerInfo
from tenure.control.admission import JobRequest
from tenure.local import LocalClient

T = TypeVar("T")

APP = "tenure.demos.examples:app"
HEARTBEAT_S = 0.5
CLAIM_TTL_S = 1.5
SWEEP_INTERVAL_S = 0.5
LONG_S = 4.0
SHORT_JOBS = 5
EXTRA_ROUNDS = 5  # if W3 happens to win no claim of the batch (see step_short_jobs)
BUSY_S = 0.3  # the short `sleep` of an extra round: it keeps whichever worker takes it busy
PARK_S = 60
FAULTS_W3 = f"after_claim=sleep:{PARK_S}"
CRASH_SLEEP_S = 30.0
PARKED_AFTER_S = 0.4  # unstarted this long: parked, not merely between its claim and its start CAS
REGISTER_TIMEOUT_S = 30.0
STEP_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 15.0
POLL_S = 0.02


class DemoFailure(Exception):
    """Something the demo relies on did not happen."""


@dataclass
class WorkerProc:
    """One `tenure worker` child process, leader of its own process group."""

    n: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    faults: str | None
    worker_id: str | None = None
    killed: bool = False

    @property
    def label(self) -> str:
        return f"W{self.n}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # start_new_session=True: the group id is the child's pid


@dataclass
class Tracked:
    """A job the demo submitted, under a short label."""

    label: str
    job_id: str
    note: str = ""


@dataclass
class Stage:
    """The demo's stage: its directory and store, its worker processes and services, its output, and the probes
    its steps wait on (`Demo` adds the steps)."""

    workdir: Path
    t0: float = field(default_factory=time.time)
    workers: list[WorkerProc] = field(default_factory=list)
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)  # `tenure up`, the mock model
    jobs: list[Tracked] = field(default_factory=list)
    client: LocalClient | None = None
    ui: bool = False  # `make demo UI=1`: leave a `tenure up` running at the end and print its dashboard URL

    # -- output ------------------------------------------------------------------------------------------
    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.workdir / 'tenure.db'}"  # an absolute path: sqlite:////tmp/...

    def rel(self, t: float | None) -> str:
        # Database times come from SQLite's clock, which is this machine's wall clock, like t0.
        return "-" if t is None else f"{t - self.t0:+.2f}s"

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.2f}s] {msg}", flush=True)

    @staticmethod
    def say(msg: str) -> None:
        print(f"{'':10}{msg}", flush=True)

    @staticmethod
    def section(title: str) -> None:
        print(f"\n── {title} " + "─" * max(3, 100 - len(title)), flush=True)

    def name(self, worker_id: str | None) -> str:
        if worker_id is None:
            return "-"
        return next((w.label for w in self.workers if w.worker_id == worker_id), worker_id)

    def label_of(self, job_id: str) -> str:
        return next((t.label for t in self.jobs if t.job_id == job_id), job_id[:8])

    @property
    def c(self) -> LocalClient:
        assert self.client is not None
        return self.client

    # -- processes ---------------------------------------------------------------------------------------
    def spawn_worker(self, n: int, faults: str | None = None) -> WorkerProc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        src = str(Path(tenure.__file__).resolve().parent.parent)  # the workers run this same tenure
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.update(
            TENURE_APP=APP,
            TENURE_HEARTBEAT_S=str(HEARTBEAT_S),
            TENURE_CLAIM_TTL_S=str(CLAIM_TTL_S),
            TENURE_SWEEP_INTERVAL_S=str(SWEEP_INTERVAL_S),
            TENURE_LOG_LEVEL="info",
        )
        if faults:
            # The pre-start window the hook stretches is the two-step claim's (docs/fault-injection.md).
            env["TENURE_FAULTS"] = faults
            env["TENURE_CLAIM_MODE"] = "two_step"
        cmd = [
            sys.executable,
            "-m",
            "tenure.cli",
            "worker",
            "--concurrency",
            "1",
            "--database-url",
            self.database_url,
        ]
        log_path = self.workdir / f"worker{n}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )
        w = WorkerProc(n, proc, log_path, faults)
        self.workers.append(w)
        extra = f" with TENURE_FAULTS={faults}" if faults else ""
        self.log(f"started worker {w.label}: pid {w.pid}{extra}")
        return w

    def check_workers(self) -> None:
        for w in self.workers:
            if not w.killed and not w.alive():
                raise DemoFailure(f"worker {w.label} (pid {w.pid}) exited on its own with status {w.proc.returncode}")

    async def kill(self, w: WorkerProc) -> float:
        """SIGKILL a worker's process group; return the database clock just before the kill."""
        at = await self.c.store.server_time()
        w.killed = True
        w.signal_group(signal.SIGKILL)
        await asyncio.to_thread(w.proc.wait, 10)
        return at

    async def wait_registered(self, ws: Sequence[WorkerProc]) -> None:
        async def probe() -> bool | None:
            by_pid = {info.pid: info for info in await self.c.workers()}
            for w in ws:
                info = by_pid.get(w.pid)
                if info is not None:
                    w.worker_id = info.id
            return all(w.worker_id for w in ws) or None

        await self.until(f"{', '.join(w.label for w in ws)} to register", probe, REGISTER_TIMEOUT_S)
        for w in ws:
            self.say(f"{w.label} registered as {w.worker_id}")

    async def shutdown(self) -> None:
        """SIGTERM the surviving workers (they drain and leave the registry) and wait for them."""
        alive = [w for w in self.workers if not w.killed and w.alive()]
        for w in alive:
            w.signal_group(signal.SIGTERM)
        self.log(f"SIGTERM to {', '.join(w.label for w in alive) or 'nobody'}: drain and leave")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for w in alive:
            try:
                code = await asyncio.to_thread(w.proc.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise DemoFailure(f"{w.label} did not exit within {DRAIN_TIMEOUT_S:g}s of SIGTERM") from None
            if code != 0:
                raise DemoFailure(f"{w.label} exited with status {code} after SIGTERM")
        registry = {i.id: i.state.value for i in await self.c.workers(include_gone=True)}
        states = ", ".join(f"{w.label} {registry.get(w.worker_id or '', '?')}" for w in self.workers)
        self.log(f"every worker process has exited; registry: {states}")
        if any(w.killed and registry.get(w.worker_id or "") != "gone" for w in self.workers):
            self.say("(a SIGKILLed worker cannot say goodbye: a sweeper marks it gone after 2 claim TTLs)")

    def kill_all(self) -> None:
        """The last resort, from `finally`: no worker outlives the demo, whatever happened."""
        for proc in self.services:  # `tenure up` and the mock model, each in its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        for w in self.workers:
            if w.alive():
                w.signal_group(signal.SIGKILL)
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(5)
            w.signal_group(signal.SIGKILL)  # anything the worker left behind in its group

    # -- waiting -----------------------------------------------------------------------------------------
    async def until(self, what: str, probe: Callable[[], Awaitable[T | None]], limit_s: float) -> T:
        """Poll `probe` until it returns something; raise DemoFailure after `limit_s`."""
        deadline = time.monotonic() + limit_s
        while True:
            value = await probe()
            if value is not None:
                return value
            self.check_workers()
            if time.monotonic() > deadline:
                raise DemoFailure(f"timed out after {limit_s:g}s waiting for {what}")
            await asyncio.sleep(POLL_S)

    async def job(self, t: Tracked) -> Job:
        return await self.c.job(t.job_id)

    async def terminal(self, t: Tracked) -> Job | None:
        job = await self.job(t)
        return job if job.state.terminal else None

    async def executions(self, t: Tracked) -> list[Execution]:
        return await self.c.store.list_executions(t.job_id)

    async def events(self, t: Tracked) -> list[Event]:
        return await self.c.events(t.job_id)

    async def runner(self, job: Job) -> str | None:
        """The worker that runs (or ran) the job's current execution."""
        if job.owner is not None:
            return job.owner
        for e in await self.c.store.list_executions(job.id):
            if e.id == job.execution_id:
                return e.worker_id
        return None

    async def submit(self, label: str, agent: str, input: Any) -> Tracked:
        t = Tracked(label, (await self.c.submit(agent, input)).job.id)
        self.jobs.append(t)
        return t

    async def submit_batch(self, labels: Sequence[str], requests: Sequence[JobRequest]) -> list[Tracked]:
        ids = await self.c.submit_many(requests)
        out = [Tracked(label, job_id) for label, job_id in zip(labels, ids, strict=True)]
        self.jobs.extend(out)
        return out

    def _proc(self, info: WorkerInfo) -> WorkerProc:
        for w in self.workers:
            if w.pid == info.pid or w.worker_id == info.id:
                return w
        raise DemoFailure(f"worker {info.id} (pid {info.pid}) was not started by this demo")

    def _detached(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A process of its own session that outlives the demo (not in `services`, so `kill_all` spares it)."""
        with open(self.workdir / "up-dashboard.log", "wb") as log_file:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )

    def _service(self, argv: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / log_name, "wb") as log_file:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )
        self.services.append(proc)
        return proc

    async def settle(self, ts: Sequence[Tracked]) -> None:
        """Wait until each job has started, finished, or sat claimed but unstarted for PARKED_AFTER_S."""

        async def probe() -> bool | None:
            now = await self.c.store.server_time()
            for t in ts:
                job = await self.job(t)
                if job.execution_started_at is not None or job.state.terminal:
                    continue
                held_s = now - job.claimed_at if job.owner is not None and job.claimed_at is not None else 0.0
                if held_s < PARKED_AFTER_S:
                    return None
            return True

        await self.until("the short jobs to be started (or held)", probe, STEP_TIMEOUT_S)

    async def find_parked(self, ts: Sequence[Tracked]) -> Tracked | None:
        for t in ts:
            job = await self.job(t)
            if job.state is JobState.QUEUED and job.owner is not None and job.execution_started_at is None:
                return t
        return None

    async def final_table(self) -> None:
        self.section("every job at the end (SUBMIT relative to the demo start; QWAIT and RUN in ms)")
        header = (
            f"{'JOB':9} {'AGENT':18} {'STATE':9} {'EPOCH':>5} {'SUBMIT':>7} {'QWAIT':>6} {'RUN':>6}  "
            f"{'EXECUTIONS (worker outcome @epoch)':35} NOTE"
        )
        print(header)
        print("-" * len(header))
        for t in self.jobs:
            job = await self.job(t)
            execs = await self.executions(t)
            ex = ", ".join(f"{self.name(e.worker_id)} {e.outcome} @{e.epoch}" for e in execs) or "-"
            print(
                f"{t.label:9} {job.agent:18} {job.state.value:9} {job.epoch:>5} "
                f"{self.rel(job.created_at):>7} {_ms(job.execution_started_at, job.created_at):>6} "
                f"{_ms(job.finished_at, job.execution_started_at):>6}  {ex:35} {t.note}"
            )
        print(
            "QWAIT = execution started - submitted; RUN = finished - started (for a lost job: until the sweeper declared it)"
        )

    async def check_final(self) -> None:
        """Every job ended as the story says: `crash` lost, every other one succeeded."""
        wrong = []
        for t in self.jobs:
            job = await self.job(t)
            expected = JobState.LOST if t.label == "crash" else JobState.SUCCEEDED
            if job.state is not expected:
                wrong.append(
                    f"{t.label} is {job.state.value} ({job.error_code}: {job.error_message}), expected {expected.value}"
                )
        if wrong:
            raise DemoFailure("; ".join(wrong))

    async def show_seen(self) -> None:
        print("what the demo saw:", flush=True)
        now = await self.c.store.server_time()
        for t in self.jobs:
            j = await self.job(t)
            print(
                f"  {t.label:9} {j.state.value:9} owner {self.name(j.owner):6} epoch {j.epoch} "
                f"claimed {self.rel(j.claimed_at)} expires {self.rel(j.claim_expires_at)} "
                f"started {self.rel(j.execution_started_at)} finished {self.rel(j.finished_at)}"
            )
        for info in await self.c.workers(include_gone=True):
            beat = f"{now - info.last_heartbeat:.2f}s ago" if info.last_heartbeat else "never"
            held = ", ".join(self.label_of(j) for j in info.jobs_held) or "-"
            print(f"  {self.name(info.id):6} pid {info.pid} {info.state.value:8} heartbeat {beat}, holds {held}")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ms(later: float | None, earlier: float | None) -> str:
    return "-" if later is None or earlier is None else f"{(later - earlier) * 1000:.0f}"


def _read_counter(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except FileNotFoundError:
        return 0


def _events_line(demo: Stage, events: Sequence[Event]) -> str:
    parts = []
    for e in events:
        extra = ""
        payload = e.payload if isinstance(e.payload, dict) else {}
        if e.type == "execution.started":
            extra = f" ({demo.name(payload.get('worker_id'))})"
        elif e.type == "effect":
            extra = f" {json.dumps(e.payload)}"
        elif e.type.startswith("job.") and payload.get("error_code"):
            extra = f" ({payload['error_code']})"
        parts.append(f"{e.cursor} {e.type}{extra}")
    return " · ".join(parts) or "none"


def _tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
