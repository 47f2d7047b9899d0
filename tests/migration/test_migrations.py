"""The schema file is the truth: applying every migration to one database and the schema file to another
gives the same tables, columns, indexes (and, on PostgreSQL, functions)."""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path

import asyncpg

from tenure.app import open_backends
from tenure.backends.sqlite._connection import split_sql
from tenure.settings import Settings
from tests.conftest import PG_BASE, drop_pg_schema, new_pg_schema, pg_url


def _sqlite_shape(path: Path) -> list[tuple[str, str, str]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'tenure_migrations%'"
            " AND name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
    finally:
        db.close()
    return [(t, n, " ".join(s.split())) for t, n, s in rows]


async def test_sqlite_migrations_equal_the_schema_file(tmp_path: Path) -> None:
    backends = await open_backends(Settings.of(database_url=f"sqlite:///{tmp_path}/migrated.db"))
    await backends.close()
    schema = resources.files("tenure.backends.sqlite").joinpath("schema.sql").read_text()
    db = sqlite3.connect(tmp_path / "schema.db")
    for statement in split_sql(schema):
        db.execute(statement)
    db.commit()
    db.close()
    assert _sqlite_shape(tmp_path / "migrated.db") == _sqlite_shape(tmp_path / "schema.db")


_PG_SHAPE = """
SELECT 'column', table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' ||
       coalesce(column_default, '')
  FROM information_schema.columns WHERE table_schema = $1 AND table_name <> 'tenure_migrations'
UNION ALL
SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename <> 'tenure_migrations'
UNION ALL
SELECT 'function', p.proname || ' ' || md5(p.prosrc) || ' ' || coalesce(array_to_string(p.proconfig, ','), '')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = $1
ORDER BY 1, 2
"""


async def test_postgres_migrations_equal_the_schema_file() -> None:
    migrated, fresh = await new_pg_schema(), await new_pg_schema()
    try:
        backends = await open_backends(Settings.of(database_url=pg_url(migrated)))
        await backends.close()
        schema = resources.files("tenure.backends.postgres").joinpath("schema.sql").read_text()
        conn = await asyncpg.connect(PG_BASE, server_settings={"search_path": fresh})
        try:
            await conn.execute(schema)
            a = [(k, v.replace(migrated, "S")) for k, v in await conn.fetch(_PG_SHAPE, migrated)]
            b = [(k, v.replace(fresh, "S")) for k, v in await conn.fetch(_PG_SHAPE, fresh)]
        finally:
            await conn.close()
        assert a == b and len(a) > 40
    finally:
        await drop_pg_schema(migrated)
        await drop_pg_schema(fresh)
