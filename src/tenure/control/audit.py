"""A job's audit as a client reads it (`GET /v1/jobs/{id}/audit`, `tenure audit ID`): one read model for every
door, tenant-checked like the job itself (docs/audit.md).

    job_id, state, attempts        the job
    executions                     every attempt, oldest first (a running one with outcome "running")
    tool_calls, evidence, usage    this page of the audit records, each list in (epoch, seq) order
    edits                          on the same page: requeues that edited the input (previous_input, input)
    steps                          the job's journal, in the order its steps began
    usage_totals                   every usage counter summed over all executions (not only this page)
    next_cursor                    give it as `cursor` for the next page of records; null on the last page
"""

from __future__ import annotations

import math
import re
from typing import Any

from tenure.contracts.audit import USAGE_COUNTERS, USAGE_GROUPS
from tenure.contracts.errors import InvalidRequest
from tenure.control.jobs import JobsService

MAX_PAGE = 1000
DEFAULT_PAGE = 200
AUDIT_CURSOR = re.compile(r"^(\d{1,10})\.(\d{1,10})$")


def parse_cursor(text: str | None) -> tuple[int, int] | None:
    """`epoch.seq` of the last record of the previous page, or None for the first page."""
    if text is None or text == "":
        return None
    m = AUDIT_CURSOR.match(text)
    if m is None:
        raise InvalidRequest("cursor is the next_cursor of the previous page (epoch.seq)")
    return int(m.group(1)), int(m.group(2))


async def job_audit(
    jobs: JobsService, job_id: str, tenant: str | None, cursor: str | None = None, limit: int = DEFAULT_PAGE
) -> dict[str, Any]:
    """The audit of one job (see the module docstring). `NotFound` for a missing job or another tenant's."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be from 1 to {MAX_PAGE}")
    after = parse_cursor(cursor)
    job = await jobs.job(job_id, tenant)
    store = jobs.store
    records = await store.read_audit(job.id, after, limit)
    executions: list[dict[str, Any]] = [
        {
            "id": e.id,
            "epoch": e.epoch,
            "worker_id": e.worker_id,
            "started_at": e.started_at,
            "ended_at": e.ended_at,
            "outcome": e.outcome,
            "usage": e.usage,
        }
        for e in await store.list_executions(job.id)
    ]
    if job.execution_id is not None and job.execution_id not in {e["id"] for e in executions}:
        executions.append(
            {
                "id": job.execution_id,
                "epoch": job.epoch,
                "worker_id": job.owner,
                "started_at": job.execution_started_at,
                "ended_at": None,
                "outcome": "running" if not job.state.terminal else job.state.value,
                "usage": None,
            }
        )
    for n, e in enumerate(executions, start=1):
        e["attempt"] = n
    by_kind: dict[str, list[dict[str, Any]]] = {"tool_call": [], "evidence": [], "usage": [], "requeue": []}
    for r in records:
        by_kind.setdefault(r.kind, []).append(r.to_dict())
    return {
        "job_id": job.id,
        "agent": job.agent,
        "state": job.state.value,
        "attempts": job.attempts,
        "executions": executions,
        "tool_calls": by_kind["tool_call"],
        "evidence": by_kind["evidence"],
        "usage": by_kind["usage"],
        "edits": by_kind["requeue"],
        "steps": [s.to_dict() for s in await store.read_steps(job.id)],
        "usage_totals": await store.audit_usage(job.id),
        "next_cursor": f"{records[-1].epoch}.{records[-1].seq}" if len(records) == limit else None,
    }


MAX_TIME = 1e11
"""The default end of a usage window (epoch seconds): after every record."""


async def usage_report(
    jobs: JobsService, tenant: str | None, from_s: float | None, to_s: float | None, group_by: str = "tenant"
) -> dict[str, Any]:
    """`GET /v1/usage` and `tenure usage`: the usage records of [from, to) (epoch seconds; default all time), of
    the caller's tenant (None: every tenant), summed per tenant, agent or model, with the total."""
    if group_by not in USAGE_GROUPS:
        raise InvalidRequest(f"group_by must be one of {', '.join(USAGE_GROUPS)}")
    start, end = 0.0 if from_s is None else from_s, MAX_TIME if to_s is None else to_s
    for name, value in (("from", start), ("to", end)):
        if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
            raise InvalidRequest(f"{name} is a time in epoch seconds")
    groups = await jobs.store.usage_report(start, end, group_by, tenant)
    total = {c: sum(g[c] for g in groups) for c in USAGE_COUNTERS}
    return {"from": from_s, "to": to_s, "group_by": group_by, "groups": groups, "total": total}
