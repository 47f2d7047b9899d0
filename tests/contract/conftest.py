"""The transition table governs the contract suite: every job state change a contract test makes, through any
store on either backend, is logged by a test-only trigger on `jobs` and checked against
`tenure.contracts.states` when the test ends — a job is inserted `INITIAL`, and each later change is in
`TRANSITIONS`. An illegal one fails the test (at teardown), whichever code path made it.

The trigger and its log table live only in the tests' own databases; the stores never see them (a trigger's
writes are not counted in a statement's row count, and `RETURNING` is unchanged)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.backends.sqlite._connection import sqlite_path
from tenure.contracts.errors import IllegalTransition
from tenure.contracts.states import INITIAL, JobState, check_transition
from tenure.contracts.store import Backends
from tenure.settings import Settings

T = TypeVar("T")

_SQLITE_TRIGGERS = [
    "CREATE TABLE IF NOT EXISTS test_state_changes"
    " (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, old TEXT, new TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS test_state_insert AFTER INSERT ON jobs BEGIN"
    " INSERT INTO test_state_changes (job_id, old, new) VALUES (NEW.id, NULL, NEW.state); END",
    "CREATE TRIGGER IF NOT EXISTS test_state_update AFTER UPDATE OF state ON jobs WHEN OLD.state IS NOT NEW.state"
    " BEGIN INSERT INTO test_state_changes (job_id, old, new) VALUES (NEW.id, OLD.state, NEW.state); END",
]

_PG_TRIGGERS = """
CREATE TABLE IF NOT EXISTS test_state_changes (id bigserial PRIMARY KEY, job_id text NOT NULL, old text,
                                               new text NOT NULL);
CREATE OR REPLACE FUNCTION test_log_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_state_changes (job_id, old, new)
    VALUES (NEW.id::text, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER test_state_insert AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION test_log_state();
CREATE OR REPLACE TRIGGER test_state_update AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION test_log_state();
"""


@dataclass(frozen=True)
class StateChange:
    """One logged change of a job's state (`old` None: the job was inserted)."""

    id: int
    job_id: str
    old: str | None
    new: str


def check_changes(changes: list[StateChange]) -> int:
    """Raise `IllegalTransition` for the first change the table does not allow (or a job not inserted
    `INITIAL`); return how many changes were checked. Changes are taken per job, in the order they were made."""
    last: dict[str, str] = {}
    for c in sorted(changes, key=lambda c: c.id):
        if c.old is None:
            if c.new != INITIAL.value:
                raise IllegalTransition(f"job {c.job_id} was inserted {c.new}, not {INITIAL.value}")
        else:
            if last.get(c.job_id, c.old) != c.old:  # a gap would mean the log missed a change
                raise AssertionError(f"job {c.job_id}: logged {c.old} -> {c.new} after it became {last[c.job_id]}")
            check_transition(JobState(c.old), JobState(c.new))
        last[c.job_id] = c.new
    return len(changes)


class StateLog:
    """The trigger's log in one test database: read it, write behind the stores' back, forget entries."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.postgres = not database_url.startswith("sqlite:")

    async def install(self) -> None:
        """Create the log table and the triggers (idempotent)."""
        if self.postgres:
            await self._pg(lambda conn: conn.execute(_PG_TRIGGERS))
            return

        def create(db: sqlite3.Connection) -> None:
            for sql in _SQLITE_TRIGGERS:
                db.execute(sql)

        self._sqlite(create)

    async def changes(self) -> list[StateChange]:
        query = "SELECT id, job_id, old, new FROM test_state_changes ORDER BY id"
        rows: list[Any]
        if self.postgres:
            rows = await self._pg(lambda conn: conn.fetch(query))
        else:
            rows = self._sqlite(lambda db: db.execute(query).fetchall())
        return [StateChange(int(r[0]), str(r[1]), r[2], r[3]) for r in rows]

    async def force_state(self, job_id: str, state: str) -> None:
        """Set a job's state directly, as no store ever would: what the check must catch."""
        if self.postgres:
            await self._pg(lambda conn: conn.execute("UPDATE jobs SET state = $2 WHERE id = $1::uuid", job_id, state))
        else:
            self._sqlite(lambda db: db.execute("UPDATE jobs SET state = ? WHERE id = ?", (state, job_id)))

    async def forget(self, change: StateChange) -> None:
        if self.postgres:
            await self._pg(lambda conn: conn.execute("DELETE FROM test_state_changes WHERE id = $1", change.id))
        else:
            self._sqlite(lambda db: db.execute("DELETE FROM test_state_changes WHERE id = ?", (change.id,)))

    async def _pg(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        conn = await asyncpg.connect(self.url)
        try:
            return await fn(conn)
        finally:
            await conn.close()

    def _sqlite(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # A short-lived connection of the test's own (the stores' connections are on their threads).
        db = sqlite3.connect(sqlite_path(self.url), isolation_level=None, timeout=30)
        try:
            return fn(db)
        finally:
            db.close()


@pytest.fixture
async def state_log(database_url: str) -> AsyncIterator[StateLog]:
    """The database migrated and its state changes logged from here on; checked against the transition table
    when the test ends."""
    await (await open_backends(Settings.of(database_url=database_url))).close()  # the `jobs` table exists
    log = StateLog(database_url)
    await log.install()
    yield log
    check_changes(await log.changes())


@pytest.fixture
async def backends(database_url: str, state_log: StateLog) -> AsyncIterator[Backends]:
    """The root conftest's `backends`, with every state change it (or any other store) makes checked."""
    b = await open_backends(Settings.of(database_url=database_url))
    try:
        yield b
    finally:
        await b.close()
