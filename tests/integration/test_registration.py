"""A worker started before its store is reachable (docs/routing.md, "Registration"): it keeps trying with a
jittered backoff (1 s doubling to 30 s, × 0.5–1.0), logs every attempt, never exits, and registers once the store
answers; then it runs jobs like any other.

PostgreSQL is "not up yet" behind a local TCP forwarder of the test's own: its port refuses connections until the
forwarder starts listening, 7 s after the worker.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tenure.app import open_backends
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import WorkerInfo
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings
from tests.integration.procs import WorkerProc, eventually
from tests.integration.redisproc import free_port

pytestmark = pytest.mark.slow


class Forwarder:
    """A TCP forwarder from 127.0.0.1:`port` to PostgreSQL, opened and closed by the test."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self.target = target
        self.server: asyncio.Server | None = None
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for w in self._writers:
            w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.fixture
async def pg_behind_a_forwarder(pg_database_url: str) -> AsyncIterator[tuple[str, str, Forwarder]]:
    """(the real URL, the URL through the forwarder's port, the forwarder: not listening yet)."""
    parts = urlsplit(pg_database_url)
    port = free_port()
    via = urlunsplit(parts._replace(netloc=parts.netloc.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{port}")))
    assert via != pg_database_url
    forwarder = Forwarder(port, (parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        yield pg_database_url, via, forwarder
    finally:
        await forwarder.close()


_ATTEMPT = re.compile(r"worker registration: attempt (\d+) failed, next attempt in ([0-9.]+) s")


async def test_a_worker_started_before_postgres_registers_once_it_answers(
    pg_behind_a_forwarder: tuple[str, str, Forwarder], tmp_path: Path
) -> None:
    real_url, via, forwarder = pg_behind_a_forwarder
    worker = WorkerProc(via, tmp_path, "early", env={"TENURE_LOG_FORMAT": "json"})
    backends = await open_backends(Settings.of(database_url=real_url))
    try:
        await asyncio.sleep(7.0)  # PostgreSQL "starts" 7 s later
        assert worker.proc.poll() is None, worker.log()  # still trying, not crashed
        assert await backends.jobs.list_workers() == []
        await forwarder.open()
        (registered,) = await eventually(backends.jobs.list_workers, 40, "the worker to register")
        log = worker.log()
        attempts = [(int(n), float(w)) for n, w in _ATTEMPT.findall(log)]
        assert len(attempts) >= 3, log
        assert [n for n, _ in attempts] == list(range(1, len(attempts) + 1))
        for n, wait in attempts:  # 1 s doubling to 30 s, each × a random factor in [0.5, 1.0]
            ceiling = min(30.0, 2.0 ** (n - 1))
            assert ceiling / 2 - 0.01 <= wait <= ceiling + 0.01, (n, wait)
        assert len({round(w / min(30.0, 2.0 ** (n - 1)), 2) for n, w in attempts}) > 1, attempts  # jittered
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        logged = [x for x in lines if "worker registration" in x.get("msg", "")]
        assert all({"attempt", "wait_s", "error"} <= x.keys() for x in logged), logged
        assert all(x.get("worker_id") == registered.id for x in logged)  # one incarnation, one id
        # A registered worker like any other: it runs a job.
        admitted = await Admission(backends.jobs, {}).admit(JobRequest("echo", {"x": 1}))

        async def done() -> bool:
            job = await backends.jobs.get_job(admitted.job.id)
            return job is not None and job.state is JobState.SUCCEEDED

        await eventually(done, 30, "the echo job to succeed")
        worker.signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0
    finally:
        worker.stop()
        await backends.close()


async def test_a_worker_stopped_while_waiting_for_its_store_exits_cleanly(tmp_path: Path) -> None:
    worker = WorkerProc(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere", tmp_path, "never")
    try:
        await eventually(lambda: asyncio.sleep(0, "attempt 2 failed" in worker.log()), 20, "two attempts")
        worker.signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 20) == 0, worker.log()
        assert "stopped before the worker could register" in worker.log()
    finally:
        worker.stop()


async def test_heartbeats_are_not_queued_behind_job_traffic_on_the_pool(pg_database_url: str) -> None:
    """Seed 002, pitfall 2: with every pool connection busy (job traffic), a heartbeat still goes through, on
    the connection of its own (`tenure-heartbeat`)."""
    backends = await open_backends(Settings.of(database_url=pg_database_url))
    held = []
    try:
        store = backends.jobs
        await store.register_worker(WorkerInfo("w-1", "h", 1, 1, ("echo",)))
        pool = store.store.pool  # type: ignore[attr-defined]  # AfterCommit over PostgresStore
        for _ in range(pool.get_max_size()):
            held.append(await pool.acquire())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.acquire(), 0.5)  # the pool is exhausted
        reply = await asyncio.wait_for(store.heartbeat("w-1", WorkerState.ACTIVE, 0, [], 30.0), 5.0)
        assert not reply.drain
        names = {r["application_name"] for r in await held[0].fetch("SELECT application_name FROM pg_stat_activity")}
        assert "tenure-heartbeat" in names
    finally:
        for conn in held:
            await pool.release(conn)
        await backends.close()
