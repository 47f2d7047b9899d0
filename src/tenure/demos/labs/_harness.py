"""What every lab does: a throw-away store, worker processes in the lab's process group, JSON lines out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tenure
from tenure.app import open_backends
from tenure.contracts.store import Leases
from tenure.local import LocalClient, connect
from tenure.settings import Settings

APP = "tenure.demos.labs.agents:app"


def emit(kind: str, **data: Any) -> None:
    """One line of the lab's output."""
    print(json.dumps({"kind": kind, **data}, default=str), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabWorker:
    """One `tenure worker` of the lab."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    worker_id: str | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)


@dataclass
class Harness:
    """The lab's directory, store, timings and workers."""

    directory: Path
    heartbeat_s: float = 0.5
    claim_ttl_s: float = 1.5
    sweep_s: float = 0.5
    workers: list[LabWorker] = field(default_factory=list)
    t0: float = field(default_factory=time.time)

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.directory / 'lab.db'}"

    def t(self) -> float:
        """Seconds since the lab started."""
        return round(time.time() - self.t0, 3)

    def settings(self) -> Settings:
        return Settings.of(
            database_url=self.database_url,
            app=APP,
            heartbeat_s=self.heartbeat_s,
            claim_ttl_s=self.claim_ttl_s,
            sweep_interval_s=self.sweep_s,
        )

    def spawn(
        self, name: str, *, concurrency: int = 1, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> LabWorker:
        """Start a worker in the lab's process group (the gateway kills the group when the lab ends)."""
        full = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        src = str(Path(tenure.__file__).resolve().parent.parent)
        full["PYTHONPATH"] = os.pathsep.join(p for p in (src, full.get("PYTHONPATH")) if p)
        full.update(
            TENURE_APP=APP,
            TENURE_DATABASE_URL=self.database_url,
            TENURE_HEARTBEAT_S=str(self.heartbeat_s),
            TENURE_CLAIM_TTL_S=str(self.claim_ttl_s),
            TENURE_SWEEP_INTERVAL_S=str(self.sweep_s),
            TENURE_POLL_S="0.2",
            TENURE_LOG_FORMAT="json",
            TENURE_LOG_LEVEL="info",
        )
        full.update(env or {})
        log_path = self.directory / f"{name}.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tenure.cli", "worker", "--concurrency", str(concurrency), *args],
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        w = LabWorker(name, proc, log_path)
        self.workers.append(w)
        return w

    async def registered(self, client: LocalClient, ws: list[LabWorker], timeout_s: float = 30) -> None:
        """Wait until each worker is in the registry, and learn its id."""
        deadline = time.monotonic() + timeout_s
        while True:
            by_pid = {i.pid: i.id for i in await client.workers()}
            for w in ws:
                w.worker_id = by_pid.get(w.proc.pid, w.worker_id)
            if all(w.worker_id for w in ws):
                return
            if time.monotonic() > deadline or any(not w.alive() for w in ws):
                raise RuntimeError("a lab worker did not start: " + "; ".join(_tail(w.log_path) for w in ws))
            await asyncio.sleep(0.1)

    def name_of(self, worker_id: str | None) -> str | None:
        return next((w.name for w in self.workers if w.worker_id == worker_id), worker_id)

    def kill_all(self) -> None:
        for w in self.workers:
            w.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM; SIGKILL works on it anyway
            w.signal(signal.SIGKILL)
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(5)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@asynccontextmanager
async def lab_leases(h: Harness) -> AsyncIterator[Leases]:
    """The lease backend of the lab's throw-away store (the quota the workers share)."""
    backends = await open_backends(h.settings(), migrate=False)
    try:
        yield backends.leases
    finally:
        await backends.close()


@asynccontextmanager
async def lab_store(h: Harness) -> AsyncIterator[LocalClient]:
    """The lab's client on its throw-away store; every worker is killed when the block ends."""
    try:
        async with connect(APP, settings=h.settings()) as client:
            yield client
    finally:
        h.kill_all()
