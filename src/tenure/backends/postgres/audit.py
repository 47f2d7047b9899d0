"""The audit chain and the effect journal on PostgreSQL (`AuditWrites`, mixed into `PostgresStore`).

Every write is one statement that joins the job row it is fenced by (`audit.sql`): a fence that lost writes
nothing, the same rule and the same answer as `append_events`. A worker's pending events and audit records
travel together (`append_audit`: one round trip, one commit).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tenure.backends import _rows
from tenure.backends._queries import load_queries
from tenure.backends.postgres import _batches
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
from tenure.contracts.types import Fence, NewEvent, NewJob, is_uuid

if TYPE_CHECKING:
    from tenure.backends.postgres._connections import StoreConnections

Q = load_queries("tenure.backends.postgres", "audit.sql")
_TERMINAL = sorted(s.value for s in TERMINAL)


async def enqueue_with_budgets(conn: Any, sql: str, columns: list[list[Any]], jobs: Sequence[NewJob]) -> list[Any]:
    """The enqueue statement `sql`; when any job has a budget, in one transaction with their budgets (written
    for the jobs it inserted). Without budgets, exactly the enqueue as it was."""
    if all(j.budget_json is None for j in jobs):
        return list(await conn.fetch(sql, *columns))
    async with conn.transaction():
        rows = list(await conn.fetch(sql, *columns))
        await insert_budgets(conn, jobs, {r["id"] for r in rows})
    return rows


async def insert_budgets(conn: Any, jobs: Sequence[NewJob], inserted: set[str]) -> None:
    """The budgets of the jobs of `jobs` the enqueue inserted (`inserted`: their ids), inside its transaction."""
    budgets = [(j.id, j.budget_json) for j in jobs if j.budget_json is not None and j.id in inserted]
    if budgets:
        await conn.execute(Q["insert_budgets"], [i for i, _ in budgets], [b for _, b in budgets])


async def edit_input(conn: Any, job_id: str, input_json: str) -> None:
    """A requeue's edited input and its audit record, inside the requeue's transaction."""
    await conn.execute(Q["edit_input"], job_id, input_json)


def _step(r: Any) -> StepRecord:
    return StepRecord(
        r["job_id"], r["key"], r["state"], r["epoch"], r["execution_id"], r["started_at"], r["ended_at"], r["result"]
    )


def _records(records: Sequence[AuditRecord]) -> list[list[Any]]:
    rows = (
        (
            r.fence.job_id,
            r.fence.epoch,
            r.fence.token,
            r.seq,
            r.execution_id,
            r.kind,
            r.name,
            r.data_json,
            r.started_at,
            r.ended_at,
        )
        for r in records
    )
    return _batches.columns(rows, 10)


class AuditWrites:
    """The audit and journal half of `PostgresStore` (it provides `_db`)."""

    _db: StoreConnections

    async def append_audit(self, records: Sequence[AuditRecord], events: Sequence[NewEvent]) -> set[str]:
        if not records and not events:
            return set()
        async with self._db.pooled("append_audit") as conn:
            rows = await conn.fetch(Q["append_audit"], *_batches.events(events), *_records(records))
        owning = {(r["id"], r["epoch"], r["token"]) for r in rows}
        fences = [e.fence for e in events] + [r.fence for r in records]
        return {f.job_id for f in fences if (f.job_id, f.epoch, f.token) not in owning}

    async def read_audit(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[StoredRecord]:
        if not is_uuid(job_id):
            return []
        epoch, seq = after if after is not None else (-1, -1)
        async with self._db.pooled("read_audit") as conn:
            rows = await conn.fetch(Q["read_records"], job_id, epoch, seq, limit)
        return [_rows.stored_record(r) for r in rows]

    async def audit_usage(self, job_id: str) -> dict[str, float]:
        if not is_uuid(job_id):
            return {}
        async with self._db.pooled("audit_usage") as conn:
            rows = await conn.fetch(Q["usage_records"], job_id)
        return sum_usage(json.loads(r["data"]) for r in rows)

    async def read_budget(self, job_id: str) -> BudgetUse | None:
        if not is_uuid(job_id):
            return None
        async with self._db.pooled("read_budget") as conn:
            row = await conn.fetchrow(Q["read_budget"], job_id)
        return None if row is None else budget_use(row["budget"], row)

    async def purge_finished(
        self, older_than_s: float, limit: int, by_tenant: Mapping[str, float] | None = None
    ) -> list[str]:
        own = sorted((by_tenant or {}).items())
        args = (older_than_s, limit, _TERMINAL, [t for t, _ in own], [float(s) for _, s in own])
        async with self._db.pooled("purge_finished") as conn:
            rows = await conn.fetch(Q["purge_finished"], *args)
        return [r["id"] for r in rows]

    async def usage_report(self, from_s: float, to_s: float, group_by: str, tenant: str | None) -> list[dict[str, Any]]:
        async with self._db.pooled("usage_report") as conn:
            rows = await conn.fetch(Q["usage_report"], from_s, to_s, group_by, tenant)
        return [usage_row(r["k"] or None, r) for r in rows]

    async def read_steps(self, job_id: str) -> list[StepRecord]:
        if not is_uuid(job_id):
            return []
        async with self._db.pooled("read_steps") as conn:
            rows = await conn.fetch(Q["read_steps"], job_id)
        return [_step(r) for r in rows]

    async def begin_step(self, fence: Fence, execution_id: str, key: str) -> StepRecord | None:
        async with self._db.pooled("begin_step") as conn:
            row = await conn.fetchrow(Q["begin_step"], fence.job_id, fence.epoch, fence.token, key, execution_id)
        return None if row is None else _step(row)

    async def end_step(self, fence: Fence, execution_id: str, key: str, result_json: str) -> bool:
        args = (fence.job_id, fence.epoch, fence.token, key, execution_id, result_json)
        return await self._fenced("end_step", Q["end_step"], args)

    async def resolve_step(self, fence: Fence, key: str, result_json: str) -> bool:
        return await self._fenced(
            "resolve_step", Q["resolve_step"], (fence.job_id, fence.epoch, fence.token, key, result_json)
        )

    async def clear_step(self, fence: Fence, execution_id: str, key: str) -> bool:
        return await self._fenced("clear_step", Q["clear_step"], (fence.job_id, fence.epoch, fence.token, key, execution_id))

    async def _fenced(self, what: str, sql: str, args: tuple[Any, ...]) -> bool:
        async with self._db.pooled(what) as conn:
            return await conn.fetchrow(sql, *args) is not None
