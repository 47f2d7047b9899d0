"""Admission: turn a client's request into a validated `NewJob`, or refuse it with a clear error.

Nothing is written for a refused request. The idempotency digest is SHA-256 of `tenant|key` (unique per
tenant in the store); the request fingerprint covers everything that defines the job, so replaying a key with a
different request is a conflict, never a second job and never a silent reuse.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenure.contracts.errors import InputTooLarge, InvalidRequest, StoreUnavailable, UnknownAgent
from tenure.contracts.ready import ReadyHint, ReadyIndex
from tenure.contracts.store import Store
from tenure.contracts.types import DEFAULT_TENANT, AgentSpec, Enqueued, NewJob, new_id

MAX_PRIORITY = 100
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Bounds on what a request may ask for."""

    max_input_bytes: int = 1024 * 1024
    default_deadline_s: float | None = 300.0
    max_deadline_s: float = 7 * 24 * 3600.0
    max_attempts_cap: int = 100


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a client asks for. Only `agent` and `input` are required."""

    agent: str
    input: Any = None
    priority: int | None = None
    requires: Sequence[str] = ()
    deadline_s: float | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    tenant: str = DEFAULT_TENANT


def idem_digest(tenant: str, key: str) -> bytes:
    """SHA-256 of `tenant|key`: the same key of two tenants never collides."""
    return hashlib.sha256(f"{tenant}|{key}".encode()).digest()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class Admission:
    """Validates requests against the registered agents and limits, then enqueues them."""

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, AgentSpec],
        limits: AdmissionLimits | None = None,
        ready_index: ReadyIndex | None = None,
    ) -> None:
        self.store = store
        self.agents = dict(agents)
        # Optional accelerator: new jobs are hinted to the ready index after the store committed them.
        self.ready_index = ready_index
        self.limits = limits or AdmissionLimits()

    def build(self, req: JobRequest) -> NewJob:
        """Validate one request; raise `InvalidRequest` (or a subclass) with a message a client can act on."""
        spec = self.agents.get(req.agent) if isinstance(req.agent, str) else None
        if spec is None:
            known = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgent(f"unknown agent {req.agent!r} (registered agents: {known})")
        try:
            input_json = json.dumps(req.input, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"input is not JSON-serializable: {exc}") from exc
        size = len(input_json.encode())
        if size > self.limits.max_input_bytes:
            raise InputTooLarge(
                f"input is {size} bytes of JSON; the limit is {self.limits.max_input_bytes} bytes "
                "(store large inputs elsewhere and pass a reference)"
            )
        priority = spec.priority if req.priority is None else req.priority
        if not _is_int(priority) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidRequest(f"priority must be an integer from 0 to {MAX_PRIORITY}, not {priority!r}")
        max_attempts = spec.max_attempts if req.max_attempts is None else req.max_attempts
        if not _is_int(max_attempts) or not 1 <= max_attempts <= self.limits.max_attempts_cap:
            raise InvalidRequest(
                f"max_attempts must be an integer from 1 to {self.limits.max_attempts_cap}, not {max_attempts!r}"
            )
        deadline_s = self.limits.default_deadline_s if req.deadline_s is None else req.deadline_s
        if deadline_s is not None and (
            isinstance(deadline_s, bool)
            or not isinstance(deadline_s, int | float)
            or not math.isfinite(deadline_s)
            or not 0 < deadline_s <= self.limits.max_deadline_s
        ):
            raise InvalidRequest(
                f"deadline_s must be a number of seconds in (0, {self.limits.max_deadline_s:g}], not {deadline_s!r}"
            )
        requires = _tags(req.requires) | spec.requires
        if not isinstance(req.tenant, str) or not req.tenant:
            raise InvalidRequest("tenant must be a non-empty string")
        digest = None
        if req.idempotency_key is not None:
            key = req.idempotency_key
            if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
                raise InvalidRequest(f"an idempotency key is a string of 1 to {MAX_KEY_LENGTH} characters")
            digest = idem_digest(req.tenant, key)
        fingerprint = hashlib.sha256(
            json.dumps([spec.name, input_json, priority, sorted(requires), deadline_s, max_attempts]).encode()
        ).digest()
        return NewJob(
            id=new_id(),
            tenant=req.tenant,
            agent=spec.name,
            input_json=input_json,
            priority=priority,
            requires=tuple(sorted(requires)),
            max_attempts=max_attempts,
            timeout_s=spec.timeout_s,
            retry_safe=spec.retry_safe,
            deadline_s=deadline_s,
            idem_digest=digest,
            request_fingerprint=fingerprint,
        )

    async def submit(self, req: JobRequest) -> Enqueued:
        """Validate and enqueue one job."""
        job = self.build(req)
        (out,) = await self.store.enqueue([job])
        await self.hint([job], [out])
        return out

    async def submit_many(self, reqs: Iterable[JobRequest]) -> list[Enqueued]:
        """Validate every request first (all or nothing), then enqueue them in one batch."""
        jobs = [self.build(r) for r in reqs]
        out = await self.store.enqueue(jobs)
        await self.hint(jobs, out)
        return out

    async def hint(self, jobs: list[NewJob], enqueued: list[Enqueued]) -> None:
        """Publish ready hints for the jobs created now. The index is an accelerator: if it is down, workers
        find the jobs by polling the store, so a failure here is logged, never raised."""
        if self.ready_index is None:
            return
        created = {e.job_id for e in enqueued if e.created}
        hints = [ReadyHint(j.id, j.agent, j.priority) for j in jobs if j.id in created]
        try:
            await self.ready_index.publish(hints)
        except StoreUnavailable as exc:
            logging.getLogger("tenure.admission").warning("ready index unavailable, workers will poll: %s", exc)


def _tags(tags: Iterable[str]) -> frozenset[str]:
    out = set()
    if isinstance(tags, str):
        raise InvalidRequest("requires must be a list of capability tags, not a string")
    for t in tags:
        if not isinstance(t, str) or not re.fullmatch(r"[A-Za-z0-9_.:/-]{1,64}", t):
            raise InvalidRequest(f"{t!r} is not a valid capability tag (letters, digits, _.:/-, 1-64 chars)")
        out.add(t)
    return frozenset(out)
