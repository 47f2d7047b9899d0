"""Concurrency keys on PostgreSQL (docs/scheduling.md): the enqueue of keyed jobs and the passing of a key's turn.

A keyed job holds one of its key's turns or waits for one (`jobs.key_wait`); a waiting job is outside
`jobs_ready`, so the claim — the same statement as for any job — never takes it: the rule holds for every
gateway and worker because it is in the rows. Every decision about a key runs under the key's advisory lock
(`key_lock`, held to the end of the transaction), reads the key's live jobs (`key_live`, fresh after the lock:
READ COMMITTED takes a snapshot per statement) and applies what `_rules.key_plan` / `_rules.key_promotions`
decide. A turn is passed in its own transaction after the finish that ended the holder committed; a process that
dies in between leaves a key with a free turn and a waiting job, which the sweeper passes (`pass_stalled`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import asyncpg

from tenure.backends import _rows, _rules
from tenure.backends._queries import load_queries
from tenure.backends.postgres import _batches
from tenure.backends.postgres._connections import StoreConnections
from tenure.backends.postgres._gate import check_gate
from tenure.backends.postgres.audit import insert_budgets
from tenure.contracts.errors import KeyBusy
from tenure.contracts.reports import GateAsk, WaitingInfo
from tenure.contracts.types import Enqueued, NewJob, check_replay, is_uuid

Q = load_queries("tenure.backends.postgres")


def locked(j: NewJob) -> bool:
    """Whether a job's enqueue takes locks: it has a concurrency key, or its agent a queue cap, or it is a child
    (its parent's row is locked FOR SHARE while the fence is checked, docs/coordinators.md)."""
    return j.concurrency_key is not None or j.queue_cap is not None or j.parent_fence is not None


async def _live(conn: asyncpg.Connection, tenant: str, key: str) -> list[_rules.KeyedJob]:
    return [_rows.keyed(r) for r in await conn.fetch(Q["key_live"], tenant, key)]


async def enqueue_mixed(
    db: StoreConnections, jobs: Sequence[NewJob], notify: bool, gate: GateAsk | None = None
) -> list[Enqueued]:
    """A batch with keyed or capped jobs, all in one transaction (`enqueue_keyed`: all or nothing), after the
    gate's read when given. The owners of interrupted jobs are signalled (NOTIFY; without it, their next heartbeat
    reply tells them)."""
    async with db.pooled("enqueue_keyed") as conn:
        done, interrupted = await enqueue_keyed(conn, jobs, gate)
        if interrupted and notify:
            await conn.execute(Q["notify_control"], interrupted)
    return [done[j.id] for j in jobs]


async def enqueue_keyed(
    conn: asyncpg.Connection, jobs: Sequence[NewJob], gate: GateAsk | None = None
) -> tuple[dict[str, Enqueued], list[str]]:
    """Enqueue a batch in one transaction, under the locks of its capped agents and its keys: a capped job only
    while its agent's waiting jobs are under the cap (else `AgentQueueFull`), a keyed one as `_rules.key_plan`
    says. Returns the answers by job id and the jobs whose owner must be told to cancel (`interrupt`).
    Raises `KeyBusy` for a `reject` job of a busy key (the whole batch is rolled back: nothing is written)."""
    out: dict[str, Enqueued] = {}
    interrupted: list[str] = []
    async with conn.transaction():
        if gate is not None:
            await check_gate(conn, gate)
        # Every agent's lock before every key's, each in order: two batches never wait for each other in a cycle.
        for agent, mode in sorted({(j.agent, j.queue_cap_mode or "") for j in jobs if j.queue_cap is not None}):
            await conn.execute(Q["cap_lock"], f"{agent}|{mode}")
        for tenant, key in sorted({(j.tenant, j.concurrency_key) for j in jobs if j.concurrency_key is not None}):
            await conn.execute(Q["key_lock"], tenant, key)
        for j in jobs:
            if (f := j.parent_fence) is not None:
                _rules.check_parent_owns(j, await conn.fetchval(Q["parent_owns"], f.job_id, f.epoch, f.token) is not None)
            if j.idem_digest is not None:
                found = await conn.fetchrow(Q["jobs_by_idem"], j.tenant, [j.idem_digest])
                if found is not None:  # a replay answers its original job and changes nothing
                    check_replay(found["id"], bytes(found["request_fingerprint"]), j.request_fingerprint)
                    out[j.id] = Enqueued(_rows.job(found), False)
                    continue
            if j.queue_cap is not None:
                waiting = int(await conn.fetchval(Q["queued_of_agent"], j.agent, j.queue_cap_mode))
                _rules.check_queue_cap(j.id, j.agent, j.queue_cap, waiting)
            if j.concurrency_key is None:
                (row,) = await conn.fetch(Q["enqueue_jobs"], *_batches.jobs([j]), *_batches.gate(None))
                out[j.id] = Enqueued(_rows.job(row), True)
                continue
            plan = _rules.key_plan(j.multitask, j.key_limit, await _live(conn, j.tenant, j.concurrency_key))
            if plan.reject is not None:
                raise KeyBusy(
                    f"concurrency key {j.concurrency_key!r} is busy: job {plan.reject} holds it (multitask reject)",
                    running_job_id=plan.reject,
                )
            (row,) = await conn.fetch(Q["enqueue_jobs"], *_batches.jobs([j], key_wait=plan.wait), *_batches.gate(None))
            out[j.id] = Enqueued(_rows.job(row), True)
            ev = _rules.DROPPED_EVENT
            for job_id in plan.drop:
                await conn.execute(Q["key_drop"], job_id, _rules.dropped_message(j.id), ev.type, ev.payload_json)
            cancelled = _rules.CANCELLED_EVENT
            flagged = []
            for job_id in plan.interrupt:  # the cancellation protocol: a persisted flag, then its owner's signal
                if await conn.fetchval(Q["cancel_job"], job_id, None, cancelled.type, cancelled.payload_json) == "requested":
                    flagged.append(job_id)
            out[j.id] = Enqueued(out[j.id].job, True, tuple(flagged))
            interrupted += flagged
        await insert_budgets(conn, jobs, {j.id for j in jobs if out[j.id].created})
    await conn.fetchval(Q["flush_barrier"])
    return out, interrupted


async def _promote(conn: asyncpg.Connection, tenant: str, key: str) -> list[str]:
    ids = _rules.key_promotions(await _live(conn, tenant, key))
    if not ids:
        return []
    return [r["id"] for r in await conn.fetch(Q["key_promote"], ids)]


async def pass_turns(conn: asyncpg.Connection, keys: Iterable[tuple[str, str]]) -> list[str]:
    """Pass the turns of these keys (tenant, key) whose holders ended: one transaction per key, under its
    lock. Returns the jobs that took a turn."""
    promoted: list[str] = []
    for tenant, key in sorted(set(keys)):
        async with conn.transaction():
            await conn.execute(Q["key_lock"], tenant, key)
            promoted += await _promote(conn, tenant, key)
    return promoted


async def pass_after_cancel(conn: asyncpg.Connection, job_id: str) -> None:
    """A job cancelled before it started may have held its key's turn: pass it."""
    row = await conn.fetchrow(Q["key_of_job"], job_id)
    if row is not None:
        await pass_turns(conn, [(row["tenant"], row["concurrency_key"])])


async def pass_stalled(conn: asyncpg.Connection) -> list[str]:
    """The sweeper's floor: pass the turns of keys that have a waiting job and a free turn."""
    rows = await conn.fetch(Q["key_stalled"])
    return await pass_turns(conn, [(r["tenant"], r["concurrency_key"]) for r in rows])


class SchedulingReads:
    """The store's scheduling reads (`JobStore.queued_of_agent`, `JobStore.waiting_info`), mixed into
    `PostgresStore`."""

    _db: StoreConnections

    async def queued_of_agent(self, agent: str, mode: str | None = None) -> int:
        async with self._db.pooled("queued_of_agent") as conn:
            return int(await conn.fetchval(Q["queued_of_agent"], agent, mode))

    async def waiting_info(
        self, job_id: str, bound: int, queue_cap: int | None = None, cap_per_mode: bool = False
    ) -> WaitingInfo | None:
        if not is_uuid(job_id):
            return None
        async with self._db.pooled("waiting_info") as conn:
            job = await conn.fetchrow(Q["waiting_job"], job_id)
            if job is None:
                return None
            ahead = await conn.fetchrow(Q["jobs_ahead"], job_id, job["priority"], bound, job["fair_at"], job["tenant"])
            holders: list[str] = []
            if job["key_wait"]:
                holders = [k.id for k in await _live(conn, job["tenant"], job["concurrency_key"]) if k.holds]
            waiting = None
            if queue_cap is not None:
                mode = job["mode_effective"] if cap_per_mode else None
                waiting = int(await conn.fetchval(Q["queued_of_agent_upto"], job["agent"], mode, queue_cap))
        return _rules.waiting_info(ahead, bound, job["fair_at"], holders, waiting)
