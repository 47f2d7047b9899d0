"""Concurrency keys on SQLite (docs/scheduling.md), inside the caller's write transaction: the write lock
serialises every decision about every key, so no lock of its own is needed. The same rules as PostgreSQL's
(`_rules.key_plan`, `_rules.key_promotions`); here a turn passes in the very transaction that ended its holder.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from tenure.backends import _rows, _rules
from tenure.backends.sqlite._connection import Q, SqliteConnection
from tenure.contracts.errors import KeyBusy
from tenure.contracts.reports import WaitingInfo
from tenure.contracts.types import NewJob


def _live(db: sqlite3.Connection, tenant: str, key: str) -> list[_rules.KeyedJob]:
    return [_rows.keyed(r) for r in db.execute(Q["key_live"], (tenant, key)).fetchall()]


def plan(db: sqlite3.Connection, j: NewJob) -> _rules.KeyPlan:
    """The plan of a new keyed job (raises `KeyBusy` for a `reject` job of a busy key: nothing is written)."""
    assert j.concurrency_key is not None
    p = _rules.key_plan(j.multitask, j.key_limit, _live(db, j.tenant, j.concurrency_key))
    if p.reject is not None:
        raise KeyBusy(
            f"concurrency key {j.concurrency_key!r} is busy: job {p.reject} holds it (multitask reject)",
            running_job_id=p.reject,
        )
    return p


def apply(db: sqlite3.Connection, j: NewJob, p: _rules.KeyPlan) -> tuple[str, ...]:
    """After the insert of `j`: cancel the jobs it replaces, flag the running jobs it interrupts (returned)."""
    ev = _rules.DROPPED_EVENT
    for job_id in p.drop:
        row = db.execute(Q["key_drop"], (job_id, _rules.dropped_message(j.id))).fetchone()
        if row is not None:
            db.execute(Q["insert_event_next"], (job_id, row["epoch"], None, ev.type, ev.payload_json))
    flagged = []
    for job_id in p.interrupt:  # the cancellation protocol: a persisted flag, then its owner's signal
        if db.execute(Q["cancel_request"], (job_id, None)).fetchall():
            flagged.append(job_id)
    return tuple(flagged)


def pass_turns(db: sqlite3.Connection, keys: Iterable[tuple[str, str]]) -> list[str]:
    """Pass the turns of these keys (tenant, key): the waiting jobs that take a turn become claimable."""
    promoted: list[str] = []
    for tenant, key in sorted(set(keys)):
        for job_id in _rules.key_promotions(_live(db, tenant, key)):
            if db.execute(Q["key_promote"], (job_id,)).rowcount == 1:
                promoted.append(job_id)
    return promoted


def pass_stalled(db: sqlite3.Connection) -> list[str]:
    """The sweeper's floor: pass the turns of keys that have a waiting job and a free turn."""
    rows = db.execute(Q["key_stalled"]).fetchall()
    return pass_turns(db, [(r["tenant"], r["concurrency_key"]) for r in rows])


class SchedulingReads:
    """The store's scheduling reads (`JobStore.queued_of_agent`, `JobStore.waiting_info`), mixed into
    `SqliteStore`."""

    connection: SqliteConnection

    async def queued_of_agent(self, agent: str, mode: str | None = None) -> int:
        conn = self.connection
        row = await conn.run(
            lambda: conn.read(lambda db: db.execute(Q["queued_of_agent"], (agent, mode)).fetchone()), "queued"
        )
        return int(row["n"])

    async def waiting_info(
        self, job_id: str, bound: int, queue_cap: int | None = None, cap_per_mode: bool = False
    ) -> WaitingInfo | None:
        def fn(db: sqlite3.Connection) -> WaitingInfo | None:
            job = db.execute(Q["waiting_job"], (job_id,)).fetchone()
            if job is None:
                return None
            params = (job_id, job["priority"], bound, job["fair_at"], job["tenant"])
            ahead = db.execute(Q["jobs_ahead"], params).fetchone()
            holders: list[str] = []
            if job["key_wait"]:
                holders = [k.id for k in _live(db, job["tenant"], job["concurrency_key"]) if k.holds]
            waiting = None
            if queue_cap is not None:
                mode = job["mode_effective"] if cap_per_mode else None
                waiting = int(db.execute(Q["queued_of_agent_upto"], (job["agent"], mode, queue_cap)).fetchone()["n"])
            return _rules.waiting_info(ahead, bound, job["fair_at"], holders, waiting)

        conn = self.connection
        return await conn.run(lambda: conn.read(fn), "waiting_info")
