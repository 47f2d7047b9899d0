"""The audit chain and the effect journal on SQLite (`AuditWrites`, mixed into `SqliteStore`).

Every write is one write transaction that first checks the fence (`fence_owns`: job, epoch, token, running or
waiting) and writes nothing for a fence that lost: the same rule, and the same answer, as `append_events`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tenure.backends import _rows
from tenure.backends._queries import load_queries
from tenure.backends.sqlite._connection import NOW, split_sql
from tenure.backends.sqlite._connection import Q as STORE_QUERIES
from tenure.contracts.audit import (
    AuditRecord,
    BudgetUse,
    StepRecord,
    StoredRecord,
    budget_use,
    sum_usage,
    usage_row,
)
from tenure.contracts.states import TERMINAL
from tenure.contracts.types import Fence, NewEvent

Q = load_queries("tenure.backends.sqlite", "audit.sql", substitutions={"now": NOW})
_FENCE_OWNS = STORE_QUERIES["fence_owns"]
_INSERT_EVENT = STORE_QUERIES["insert_event"]
T = TypeVar("T")
_TERMINAL = json.dumps(sorted(s.value for s in TERMINAL))
_PURGE_HISTORY = split_sql(Q["purge_history"])


def _owns(db: sqlite3.Connection, f: Fence) -> bool:
    return db.execute(_FENCE_OWNS, (f.job_id, f.epoch, f.token)).fetchone() is not None


def insert_budget(db: sqlite3.Connection, job_id: str, budget_json: str) -> None:
    """A new job's budget, inside the enqueue's write transaction."""
    db.execute(Q["insert_budget"], (job_id, budget_json))


def edit_input(db: sqlite3.Connection, job_id: str, input_json: str) -> None:
    """A requeue's edited input and its audit record, inside the requeue's write transaction."""
    db.execute(Q["edit_input"], (job_id, input_json))
    db.execute(Q["set_input"], (job_id, input_json))


def _step(r: sqlite3.Row) -> StepRecord:
    return StepRecord(
        r["job_id"], r["key"], r["state"], r["epoch"], r["execution_id"], r["started_at"], r["ended_at"], r["result"]
    )


class AuditWrites:
    """The audit and journal half of `SqliteStore` (it provides `_write` and `_read`)."""

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T: ...
        async def _read(self, fn: Callable[[sqlite3.Connection], T], what: str = "query") -> T: ...

    async def append_audit(self, records: Sequence[AuditRecord], events: Sequence[NewEvent]) -> set[str]:
        if not records and not events:
            return set()

        def fn(db: sqlite3.Connection) -> set[str]:
            owning: dict[str, bool] = {}
            rejected = set()

            def owns(f: Fence) -> bool:
                ok = owning.get(f.job_id)
                if ok is None:
                    ok = owning[f.job_id] = _owns(db, f)
                if not ok:
                    rejected.add(f.job_id)
                return ok

            for e in events:
                f = e.fence
                if owns(f):
                    db.execute(_INSERT_EVENT, (f.job_id, f.epoch, e.seq, e.execution_id, e.type, e.payload_json))
            for r in records:
                f = r.fence
                if owns(f):
                    args = (f.job_id, f.epoch, r.seq, r.execution_id, r.kind, r.name, r.data_json)
                    db.execute(Q["insert_record"], (*args, r.started_at, r.ended_at))
            return rejected

        return await self._write(fn, "append_audit")

    async def read_audit(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[StoredRecord]:
        epoch, seq = after if after is not None else (-1, -1)
        rows = await self._read(lambda db: db.execute(Q["read_records"], (job_id, epoch, seq, limit)).fetchall())
        return [_rows.stored_record(r) for r in rows]

    async def audit_usage(self, job_id: str) -> dict[str, float]:
        rows = await self._read(lambda db: db.execute(Q["usage_records"], (job_id,)).fetchall())
        return sum_usage(json.loads(r["data"]) for r in rows)

    async def read_budget(self, job_id: str) -> BudgetUse | None:
        row = await self._read(lambda db: db.execute(Q["read_budget"], (job_id,)).fetchone())
        return None if row is None else budget_use(row["budget"], row)

    async def purge_finished(
        self, older_than_s: float, limit: int, by_tenant: Mapping[str, float] | None = None
    ) -> list[str]:
        own = sorted((by_tenant or {}).items())

        def candidates(db: sqlite3.Connection) -> list[tuple[str, float]]:
            # (job id, its tenant's cutoff in seconds): one bounded pass for the tenants on the default, one per
            # tenant with its own, then the oldest `limit` of them all.
            tenants = json.dumps([t for t, _ in own])
            passes = [(Q["old_finished_jobs"], older_than_s, tenants)]
            passes += [(Q["old_finished_jobs_of_tenant"], secs, tenant) for tenant, secs in own]
            rows = [(r["finished_at"], r["id"], secs)
                    for sql, secs, tenant in passes
                    for r in db.execute(sql, (secs, limit, _TERMINAL, tenant))]  # fmt: skip
            return [(job_id, secs) for _, job_id, secs in sorted(rows)[:limit]]

        picked = await self._read(candidates)
        if not picked:
            return []

        def fn(db: sqlite3.Connection) -> list[str]:
            gone = []
            for job_id, secs in picked:
                if db.execute(Q["purge_job"], (job_id, secs, _TERMINAL)).fetchone() is not None:
                    for statement in _PURGE_HISTORY:
                        db.execute(statement, (job_id,))
                    gone.append(job_id)
            return gone

        return await self._write(fn, "purge_finished")

    async def usage_report(self, from_s: float, to_s: float, group_by: str, tenant: str | None) -> list[dict[str, Any]]:
        args = (from_s, to_s, group_by, tenant)
        rows = await self._read(lambda db: db.execute(Q["usage_report"], args).fetchall())
        return [usage_row(r["k"] or None, r) for r in rows]

    async def read_steps(self, job_id: str) -> list[StepRecord]:
        rows = await self._read(lambda db: db.execute(Q["read_steps"], (job_id,)).fetchall())
        return [_step(r) for r in rows]

    async def begin_step(self, fence: Fence, execution_id: str, key: str) -> StepRecord | None:
        def fn(db: sqlite3.Connection) -> StepRecord | None:
            if not _owns(db, fence):
                return None
            db.execute(Q["begin_step"], (fence.job_id, key, fence.epoch, execution_id))
            return _step(db.execute(Q["read_step"], (fence.job_id, key)).fetchone())

        return await self._write(fn, "begin_step")

    async def end_step(self, fence: Fence, execution_id: str, key: str, result_json: str) -> bool:
        args = (fence.job_id, key, execution_id, result_json)
        return await self._fenced(fence, lambda db: db.execute(Q["end_step"], args).rowcount == 1, "end_step")

    async def resolve_step(self, fence: Fence, key: str, result_json: str) -> bool:
        args = (fence.job_id, key, result_json)
        return await self._fenced(fence, lambda db: db.execute(Q["resolve_step"], args).rowcount == 1, "resolve_step")

    async def clear_step(self, fence: Fence, execution_id: str, key: str) -> bool:
        args = (fence.job_id, key, execution_id)
        return await self._fenced(fence, lambda db: db.execute(Q["clear_step"], args).rowcount == 1, "clear_step")

    async def _fenced(self, fence: Fence, write: Callable[[sqlite3.Connection], bool], what: str) -> bool:
        return await self._write(lambda db: _owns(db, fence) and write(db), what)
