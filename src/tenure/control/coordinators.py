"""Coordinators (docs/coordinators.md): the rules of parent and child jobs, written once for every caller.

- A child comes in by the one admission door (`Admission.admit`), with an idempotency key derived from its parent
  job's id and the spawn key (`spawn_idempotency_key`) in its parent's tenant: a retried parent that spawns the
  same key gets the same child back (the store's unique `(tenant, idem_digest)` answers), never a second one.
- Cancelling a parent cancels its unfinished children (`cancel_children`), depth first: a queued child ends
  `cancelled` at once, a running one gets its cancel request; a child that is itself a coordinator cascades on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenure.contracts.errors import InvalidRequest
from tenure.contracts.store import JobStore
from tenure.contracts.types import ControlOutcome, Fence
from tenure.control.admission import JobRequest
from tenure.control.models import shown

MAX_SPAWN_KEY = 200
"""The longest spawn key (its idempotency key adds the parent's id: 43 characters, within the 255 allowed)."""


def spawn_idempotency_key(parent_job_id: str, key: str) -> str:
    """The idempotency key of child `key` of job `parent_job_id`: unique per parent, stable across its attempts."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_SPAWN_KEY:
        raise InvalidRequest(f"a spawn key is a string of 1 to {MAX_SPAWN_KEY} characters, not {shown(key)}")
    return f"spawn:{parent_job_id}:{key}"


def child_request(
    parent: Fence, parent_execution_id: str, tenant: str, agent: str, input: Any, key: str, options: Mapping[str, Any]
) -> JobRequest:
    """The admission request of one child (`ctx.spawn`): the parent's tenant, the derived idempotency key, and the
    parent's identity recorded on the child; its fence is checked by the store in the enqueue's transaction.
    `options`: `priority`, `max_attempts`, `deadline_s` (None: the defaults of the child's agent)."""
    unknown = set(options) - {"priority", "max_attempts", "deadline_s"}
    if unknown:
        raise InvalidRequest(f"ctx.spawn takes priority, max_attempts and deadline_s, not {', '.join(sorted(unknown))}")
    return JobRequest(
        agent=agent,
        input=input,
        priority=options.get("priority"),
        max_attempts=options.get("max_attempts"),
        deadline_s=options.get("deadline_s"),
        idempotency_key=spawn_idempotency_key(parent.job_id, key),
        tenant=tenant,
        parent=parent,
        parent_execution_id=parent_execution_id,
    )


async def cancel_children(store: JobStore, job_id: str, depth: int = 0) -> int:
    """Cancel the unfinished children of job `job_id` and theirs, depth first; answers how many were cancelled or
    asked to cancel. Each is the store's own `cancel` (a queued child ends at once with its terminal event, a
    running one is flagged for its owner), so a child that ends meanwhile is left as it ended."""
    if depth > 32:  # a spawn tree is shallow; a deeper one is a defect, not a reason to recurse without end
        return 0
    count = 0
    for child in await store.children(job_id):
        if child.state.terminal:
            continue
        outcome = await store.cancel(child.id)
        if outcome in (ControlOutcome.ACCEPTED, ControlOutcome.REQUESTED):
            count += 1
        count += await cancel_children(store, child.id, depth + 1)
    return count
