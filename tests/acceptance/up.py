"""`tenure up` as a user runs it: a subprocess driven only over HTTP, SSE and WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import PYTHON, ROOT, drop_pg_schema, new_pg_schema, pg_url
from tests.integration.procs import FAST

KEYS = {"tenant-a": "key-a-0123456789", "tenant-b": "key-b-0123456789"}
ADMIN_KEY = "admin-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the supervisor's children live in their own sessions)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


@contextlib.contextmanager
def store_url(backend: str, directory: Path) -> Iterator[str]:
    """A fresh store for a module-scoped server: a SQLite file in `directory`, or a PostgreSQL schema that is
    dropped afterwards (the function-scoped `database_url` fixture would start one server per test)."""
    if backend == "sqlite":
        yield f"sqlite:///{directory}/tenure.db"
        return
    schema = asyncio.run(new_pg_schema())
    try:
        yield pg_url(schema)
    finally:
        asyncio.run(drop_pg_schema(schema))


class Up:
    """One `tenure up` subprocess on a free port."""

    def __init__(
        self,
        database_url: str,
        log_dir: Path,
        *,
        workers: int = 2,
        inline: bool = False,
        env: dict[str, str] | None = None,
        app: str = "tenure.demos.examples:app",
        keys: bool = True,
        name: str = "up",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.log_path = log_dir / f"{name}.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        full.update(FAST)
        full.update({"TENURE_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT), "TENURE_APP": app})
        if keys:
            full["TENURE_API_KEYS"] = ",".join(f"{t}:{k}" for t, k in KEYS.items())
            full["TENURE_ADMIN_KEY"] = ADMIN_KEY
        full.update(env or {})
        self._log = open(self.log_path, "wb")
        argv = [PYTHON, "-m", "tenure.cli", "up", "--port", str(self.port), "--workers", str(workers)]
        if inline:
            argv.append("--inline")
        self.proc = subprocess.Popen(
            argv, env=full, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )
        self._wait_ready(workers + (1 if inline else 0))

    def _wait_ready(self, workers: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"tenure up exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/v1/workers", headers=headers, timeout=1)
                if r.status_code == 200 and len(r.json()["workers"]) >= workers:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"tenure up not ready after {timeout}s:\n{self.log()}")

    def headers(self, tenant: str | None = "tenant-a") -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS[tenant] if tenant else ADMIN_KEY}"}

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int | None:
        kids = descendants(self.proc.pid)
        code = None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in kids:  # never leave a child behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        return code
