"""A scratch store for one measurement: a PostgreSQL schema of its own on the server named by `database_url`
(dropped afterwards), or a SQLite file in a temporary directory when it is None. Run from bench/ (the scripts'
own directory is on sys.path): `from _scratch import scratch_url`."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator

import asyncpg


@contextlib.asynccontextmanager
async def scratch_url(database_url: str | None) -> AsyncIterator[str]:
    """The URL of a fresh, empty store for the block."""
    if not database_url:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"
        return
    schema = "bench_" + uuid.uuid4().hex[:10]
    conn = await asyncpg.connect(database_url)
    await conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in database_url else "?"
    try:
        yield f"{database_url}{sep}search_path={schema}"
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()
