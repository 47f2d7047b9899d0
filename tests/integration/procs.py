"""Real worker processes for integration tests: `tenure worker` subprocesses in their own process groups,
killed with real signals, logs kept for the failure message."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tests.conftest import PYTHON, ROOT

T = TypeVar("T")

# Fast but not fragile: a claim survives 5 missed heartbeats on a busy 2-core machine.
FAST = {
    "TENURE_HEARTBEAT_S": "0.3",
    "TENURE_CLAIM_TTL_S": "1.5",
    "TENURE_SWEEP_INTERVAL_S": "0.2",
    "TENURE_POLL_S": "0.2",
    "TENURE_DRAIN_TIMEOUT_S": "10",
}
TTL = float(FAST["TENURE_CLAIM_TTL_S"])
SWEEP = float(FAST["TENURE_SWEEP_INTERVAL_S"])


class TenureProc:
    """One `tenure <command>` subprocess in its own process group, its output kept in `<log_dir>/<name>.log`.
    `wrap` goes before the interpreter: `("ip", "netns", "exec", NS)` runs it on a host of its own
    (tests/integration/netns.py); `ip netns exec` execs the command, so the pid is the interpreter's."""

    def __init__(
        self,
        database_url: str,
        log_dir: Path,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        full_env.update(FAST)
        full_env.update({"TENURE_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*wrap, PYTHON, "-m", "tenure.cli", *argv],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


class WorkerProc(TenureProc):
    """One `tenure worker` subprocess."""

    def __init__(
        self,
        database_url: str,
        log_dir: Path,
        name: str,
        *,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        app: str = "tenure.demos.examples:app",
        args: tuple[str, ...] = (),
        wrap: Sequence[str] = (),
    ) -> None:
        argv = ["worker", "--app", app, "--concurrency", str(concurrency), *args]
        super().__init__(database_url, log_dir, name, argv, env=env, wrap=wrap)


async def eventually(check: Callable[[], Awaitable[T | None]], within_s: float, what: str, interval: float = 0.05) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s}s waiting for {what}")
        await asyncio.sleep(interval)
