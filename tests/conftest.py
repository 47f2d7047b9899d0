"""Shared fixtures: real SQLite files and real PostgreSQL schemas (never mocks), and the guard that fails any
blocking call made on the event loop by the runtime's own code."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.contracts.store import Backends, JobStore
from tenure.settings import Settings
from tests.integration.redisproc import RedisProc
from tests.s3server import CREDENTIALS, S3Bucket, S3Server, new_bucket

PG_BASE = os.environ.get("TENURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _start_private_redis() -> subprocess.Popen[bytes] | None:
    """A redis-server of this test run's own, unless TENURE_TEST_REDIS(_URL) names one. The machine's shared
    Redis is flushed by other test runs (FLUSHDB), which loses every lease of a test at once; tests of lease
    lifetimes cannot share it. Started here, at import, so that module-level URLs (and the helper processes
    that inherit the environment) see it; stopped in `pytest_unconfigure`."""
    if "TENURE_TEST_REDIS" in os.environ or "TENURE_TEST_REDIS_URL" in os.environ:
        return None
    server = shutil.which("redis-server")
    if server is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    # Not a TENURE_* name: Settings.from_env rejects unknown TENURE_* variables.
                    os.environ["PRIVATE_TEST_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    return None


_PRIVATE_REDIS = _start_private_redis()
REDIS_URL = os.environ.get("TENURE_TEST_REDIS") or os.environ.get("PRIVATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PRIVATE_REDIS is not None and _PRIVATE_REDIS.poll() is None:
        _PRIVATE_REDIS.kill()
        _PRIVATE_REDIS.wait()


ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def pg_url(schema: str) -> str:
    return f"{PG_BASE}?search_path={schema}"


async def new_pg_schema() -> str:
    schema = "t_" + uuid.uuid4().hex[:12]
    conn = await asyncpg.connect(PG_BASE)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()
    return schema


async def drop_pg_schema(schema: str) -> None:
    conn = await asyncpg.connect(PG_BASE)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


@pytest.fixture
async def pg_database_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema on the real server, dropped afterwards."""
    schema = await new_pg_schema()
    try:
        yield pg_url(schema)
    finally:
        await drop_pg_schema(schema)


@pytest.fixture
def sqlite_database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/tenure.db"


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Each backend in turn: the same test runs against SQLite and PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/tenure.db"
        return
    schema = await new_pg_schema()
    try:
        yield pg_url(schema)
    finally:
        await drop_pg_schema(schema)


@pytest.fixture
async def backends(database_url: str) -> AsyncIterator[Backends]:
    """The job store, signals and leases of one process on the backend under test, migrated."""
    b = await open_backends(Settings.of(database_url=database_url))
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def store(backends: Backends) -> JobStore:
    """The job store of `backends` (its writes send their signals)."""
    return backends.jobs


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server of this test's own, for tests that kill, restart or flush Redis, or whose leases must not
    be lost to another test run's FLUSHDB of a shared server (a correct loss, but one that would let the next
    holders overrun a quota). Killed afterwards."""
    server = RedisProc(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3-compatible server (moto's, an emulator: tests/s3server.py) for the test session, on a free port,
    killed at the end. Missing or broken, it fails the tests that need it."""
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    """A fresh bucket of this test's own, with the standard AWS credential variables set for the test process
    (boto3's chain reads them, as in a deployment)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    yield from new_bucket(s3_server)


@pytest.fixture(autouse=True)
def no_blocking_on_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Seed 000's first rule as a test guard: in async tests, a blocking call (file, socket, sleep...) made
    on the event loop from tenure's own code fails the test."""
    if not request.node.get_closest_marker("asyncio") and not _is_async(request):
        yield
        return
    from blockbuster import blockbuster_ctx

    with blockbuster_ctx(scanned_modules=["tenure"]) as bb:
        # asyncpg looks for ~/.pgpass and ~/.postgresql certificates while parsing connect arguments: a
        # few stat calls per new connection, never per query. Allowed there and nowhere else.
        for fn in bb.functions.values():
            fn.can_block_in("asyncpg/connect_utils.py", {"_parse_connect_dsn_and_args"})
        yield


def _is_async(request: pytest.FixtureRequest) -> bool:
    import inspect

    fn = getattr(request.node, "function", None)
    return fn is not None and inspect.iscoroutinefunction(fn)
