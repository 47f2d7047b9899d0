"""Admission: the one door by which a job comes in, whoever sends it (the gateway's HTTP and WebSocket routes,
`LocalClient` behind `tenure.connect` and `tenure submit`, the demo). `Admission.admit` turns a client's request
into a validated `NewJob`, merges same-process duplicates of its idempotency key (`InFlight`), checks the caps and
the circuit (`control.gate`, one read of the store), enqueues it and hints the ready index; it answers with the
job as inserted (`Admitted`), never reading it back. On PostgreSQL that is three round trips: the gate's read, the
insert and its flush barrier.

Nothing is written for a refused request. The idempotency digest is SHA-256 of `tenant|key` (unique per
tenant in the store); the request fingerprint covers everything that defines the job, so replaying a key with a
different request is a conflict, never a second job and never a silent reuse.

A job's input from a Python caller is held to the rules of `control/json_input.py`, the one reader of JSON text a
client sends (an HTTP body, a WebSocket frame, the CLI's `--input`), so a hostile document is refused the same way
wherever it arrives.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenure.contracts.audit import job_budget
from tenure.contracts.errors import (
    IdempotencyConflict,
    InputTooLarge,
    InvalidRequest,
    StoreUnavailable,
    UnknownAgent,
)
from tenure.contracts.ready import ReadyHint, ReadyIndex
from tenure.contracts.store import Store
from tenure.contracts.text import holds_nul
from tenure.contracts.types import DEFAULT_TENANT, AgentSpec, Enqueued, Fence, Job, NewJob, check_replay, new_id
from tenure.control.directory import AgentDirectory
from tenure.control.gate import CircuitOpen, Gate, GateConfig, GateObserver, QueueFull
from tenure.control.json_input import MAX_JSON_DEPTH, InvalidJSON, lone_surrogate, may_nest_deeper, nesting_exceeds
from tenure.control.models import KEY, TENANT, JobSpec, check, shown, validated
from tenure.control.routing import RouteChooser, Router, routed_requires
from tenure.control.scoring import Decision
from tenure.control.tenant_budgets import TenantBudget, check_tenant_budgets

HINT_TIMEOUT_S = 0.5
"""The longest a submit waits for the ready index to take its hint (it is an accelerator, never the truth)."""


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Bounds on what a request may ask for, beyond the fixed ranges of `control.models.JobSpec`."""

    max_input_bytes: int = 1024 * 1024
    default_deadline_s: float | None = 300.0
    disabled_modes: frozenset[str] = frozenset()
    """`AGENT:MODE` pairs no job runs in (TENURE_DISABLED_MODES): a job asking for one runs in the agent's next
    enabled mode, degraded (docs/scheduling.md)."""
    tenant_weights: tuple[tuple[str, float], ...] = ()
    """(tenant, weight) pairs (TENURE_TENANT_WEIGHTS): within one priority a tenant of weight 2 is served twice as
    often as one of weight 1 (the default) while both have jobs queued (docs/scheduling.md#fair-shares)."""
    # TENURE_TENANT_BUDGETS (control/tenant_budgets.py): tenants refused new jobs while over their usage budget.
    tenant_budgets: Mapping[str, TenantBudget] = field(default_factory=dict)
    allow_unregistered: bool = False
    """Admit an agent that neither the app nor any live worker knows (TENURE_ALLOW_UNREGISTERED), with the plain
    defaults of `AgentSpec`, for workers that are not up yet."""
    route_grace_ms: int = 200
    """How long only the worker routing preferred may claim a job (TENURE_ROUTE_GRACE_MS, docs/routing.md); 0
    turns routing off (no preference, no `route`)."""


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
    concurrency_key: str | None = None
    multitask: str | None = None
    """What to do when the concurrency key is busy (`MULTITASK`); None: the agent's default."""
    mode: str | None = None
    budget: Mapping[str, float] | None = None
    allow_unregistered: bool = False
    """Admit this agent even if neither the app nor a live worker knows it (`tenure submit --allow-unregistered`)."""
    parent: Fence | None = None
    parent_execution_id: str | None = None
    """Set by `ctx.spawn` (control/coordinators.py): the fence and execution of the coordinator that admits this
    child; the store admits it only while that fence owns the coordinator's job."""
    prefers: Sequence[str] = ()
    """Features a worker offering them is preferred for (merged with the agent's `prefers`; docs/routing.md)."""
    strict: bool = False
    """The preferred features are required: only a worker offering all of them claims the job."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """The answer to an admission: the job as the store holds it, and whether it was created now (False: an
    idempotency key seen before answered its original job)."""

    job: Job
    created: bool

    @property
    def id(self) -> str:
        """The job's id."""
        return self.job.id

    job_id = id

    def __getitem__(self, key: str) -> Any:
        """Dict-style access, as `tenure.client.Client.submit` answered before it returned this: `["id"]`,
        `["_created"]` and the job's fields. Deprecated: use the attributes."""
        return self.created if key == "_created" else self.job[key]


def idem_digest(tenant: str, key: str) -> bytes:
    """SHA-256 of `tenant|key`: the same key of two tenants never collides."""
    return hashlib.sha256(f"{tenant}|{key}".encode()).digest()


class Admission:
    """The one door every job comes in by (the gateway over HTTP and WebSocket, `LocalClient`, `tenure submit`,
    the demo): validate against the registered agents and limits, merge same-process duplicates of an
    idempotency key, check the caps and the circuit (one read), enqueue, hint the ready index."""

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, AgentSpec],
        limits: AdmissionLimits | None = None,
        ready_index: ReadyIndex | None = None,
        *,
        gate: GateConfig | None = None,
        on_gate: GateObserver | None = None,
        directory: AgentDirectory | None = None,
        on_degraded: Callable[[str, str], None] | None = None,
    ) -> None:
        self.store = store
        self.agents = dict(agents)
        # Agents not in the app are looked up in the live registry (control/directory.py, docs/routing.md).
        self.directory = directory if directory is not None else AgentDirectory(store)
        # Optional accelerator: new jobs are hinted to the ready index after the store committed them.
        self.ready_index = ready_index
        self.limits = limits or AdmissionLimits()
        self.gate = Gate(store, gate, on_gate)
        self.inflight = InFlight()
        # Told (requested agent, reason) of every job admitted degraded (the metric tenure_degraded_total).
        self.on_degraded = on_degraded
        # The preferred worker of each job, scored from the directory's snapshot (docs/routing.md).
        self.chooser = RouteChooser(self.directory, self.limits.route_grace_ms)
        self.router = Router(
            store,
            self.spec,
            self.gate.config.retry_after_s,
            self.limits.disabled_modes,
        )

    def build(self, req: JobRequest) -> NewJob:
        """Validate one request; raise `InvalidRequest` (or a subclass) with a message a client can act on."""
        fields = validated(JobSpec, _spec_fields(req), "the request")
        spec = self._spec_of(fields.agent, req.allow_unregistered)
        input_json, size = _input_json(req.input)
        if size > self.limits.max_input_bytes:
            raise InputTooLarge(
                f"input is {size} bytes of JSON; the limit is {self.limits.max_input_bytes} bytes "
                "(store large inputs elsewhere and pass a reference)"
            )
        priority = spec.priority if fields.priority is None else fields.priority
        max_attempts = spec.max_attempts if fields.max_attempts is None else fields.max_attempts
        deadline_s = self.limits.default_deadline_s if fields.deadline_s is None else fields.deadline_s
        requires = frozenset(fields.requires or ()) | spec.requires
        prefers = frozenset(fields.prefers or ()) | spec.prefers
        strict = bool(fields.strict)
        check(TENANT, req.tenant, "tenant")
        digest = None
        if req.idempotency_key is not None:
            check(KEY, req.idempotency_key, "idempotency_key")
            digest = idem_digest(req.tenant, req.idempotency_key)
        own = None if fields.budget is None else fields.budget.model_dump(exclude_none=True) or None
        budget = job_budget(spec.budget, own)  # the agent's default, the job's own limits over it
        defining: list[Any] = [spec.name, input_json, priority, sorted(requires), deadline_s, max_attempts]
        # Appended only when set: earlier fingerprints stay valid. The job's own budget, not the merged one: a
        # deploy that changes the agent's default must not turn the replay of a key into a conflict.
        if fields.concurrency_key is not None:
            defining += [fields.concurrency_key, fields.multitask or spec.multitask]
        if own:
            defining.append(own)
        if fields.prefers:
            defining.append(sorted(fields.prefers))
        if strict:
            defining.append("strict")
        fingerprint = hashlib.sha256(json.dumps(defining).encode()).digest()
        requires = routed_requires(requires, prefers, strict)
        job_id = new_id()
        preferred, grace_s, route_json = self.chooser.choose(spec, requires, prefers, strict, job_id)
        mode_requested, mode_effective, degraded = self._mode(spec, fields.mode)
        return NewJob(
            id=job_id,
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
            concurrency_key=fields.concurrency_key,
            key_limit=spec.key_limit,
            multitask=fields.multitask or spec.multitask,
            mode_requested=mode_requested,
            mode_effective=mode_effective,
            degraded_reason=degraded,
            fair_step=1.0 / dict(self.limits.tenant_weights).get(req.tenant, 1.0),
            budget_json=None if budget is None else json.dumps(budget),
            parent_job_id=None if req.parent is None else req.parent.job_id,
            parent_execution_id=req.parent_execution_id,
            parent_fence=req.parent,
            preferred_worker=preferred,
            preferred_grace_s=grace_s,
            route_json=route_json,
        )

    async def preview_route(
        self, agent: str, requires: Sequence[str] = (), prefers: Sequence[str] = (), strict: bool = False
    ) -> Decision:
        """The routing decision a job of `agent` would get now (`tenure route`), from the live registry read
        afresh, through the same score as `admit`; nothing is written."""
        self.directory.invalidate()
        await self.directory.resolve({agent})
        spec = self._spec_of(agent, False)
        fields = validated(JobSpec, {"agent": agent, "requires": list(requires), "prefers": list(prefers)}, "the request")
        need = frozenset(fields.requires or ()) | spec.requires
        wanted = frozenset(fields.prefers or ()) | spec.prefers
        return self.chooser.preview(spec, routed_requires(need, wanted, strict), wanted, strict)

    def _mode(self, spec: AgentSpec, asked: str | None) -> tuple[str | None, str | None, str | None]:
        """(mode_requested, mode_effective, degraded_reason) of a job of `spec` asking for mode `asked`: the
        agent's first mode by default; a disabled one (TENURE_DISABLED_MODES) runs as the next enabled mode. An agent
        that declares no modes ignores `asked`."""
        if not spec.modes:  # an agent without modes has one way to run: any mode asked for is that one
            return None, None, None
        mode = spec.modes[0] if asked is None else asked
        if mode not in spec.modes:
            raise InvalidRequest(f"mode must be one of {', '.join(spec.modes)} (agent {spec.name!r}), not {shown(mode)}")
        disabled = self.limits.disabled_modes
        enabled = [m for m in spec.modes[spec.modes.index(mode) :] if f"{spec.name}:{m}" not in disabled]
        if not enabled:
            raise InvalidRequest(f"mode {mode!r} of agent {spec.name!r} and every mode after it are disabled")
        return mode, enabled[0], None if enabled[0] == mode else "mode_disabled"

    def input_of(self, value: Any) -> str:
        """A job input as the store holds it, held to the rules of admission (JSON every store takes, the size
        limit): for a requeue with an edited input."""
        input_json, size = _input_json(value)
        if size > self.limits.max_input_bytes:
            raise InputTooLarge(f"input is {size} bytes of JSON; the limit is {self.limits.max_input_bytes} bytes")
        return input_json

    async def admit(self, req: JobRequest) -> Admitted:
        """Admit one job: build → same-process dedupe of its key → gate → enqueue → hint. The answer is the job as
        inserted (or, for a replayed key, the original job): nothing is read back."""
        await self.resolve([req])
        job = self.build(req)
        if job.idem_digest is None:
            return await self._admit(job)
        return await self.inflight.run(job.idem_digest, job.request_fingerprint, lambda: self._admit(job))

    async def admit_many(self, reqs: Iterable[JobRequest]) -> list[Admitted]:
        """Admit a batch in one enqueue: every request is validated and the caps are checked for the whole batch
        first (all or nothing), so a batch that would pass a cap is refused whole."""
        reqs = list(reqs)
        await self.resolve(reqs)
        jobs = [self.build(r) for r in reqs]
        if not jobs:
            return []
        demand: dict[tuple[str, str], int] = {}
        for j in jobs:
            demand[(j.tenant, j.agent)] = demand.get((j.tenant, j.agent), 0) + 1
        if self.limits.tenant_budgets:
            await check_tenant_budgets(self.store, self.limits.tenant_budgets, [j.tenant for j in jobs])
        ask = self.gate.ask(demand)
        if ask is None:  # several (tenant, agent) pairs: each read first
            await self.gate.check(demand)
        jobs, out = await self.router.enqueue(jobs, ask)
        self.gate.admitted(ask)
        self._count_degraded([j for j, e in zip(jobs, out, strict=True) if e.created])
        await self.hint(jobs, out)
        return [Admitted(e.job, e.created) for e in out]

    async def resolve(self, reqs: Sequence[JobRequest]) -> None:
        """Read the live registry (cached, control/directory.py) when a request names an agent the app does not
        define, so that `build` can find it there."""
        names = {r.agent for r in reqs if isinstance(r.agent, str) and r.agent not in self.agents}
        if names or self.limits.route_grace_ms > 0:  # routing scores from the same snapshot (at most one read per TTL)
            await self.directory.resolve(names)

    def spec(self, name: str) -> AgentSpec | None:
        """The spec of agent `name`, from the app or the live registry (as last read), or None."""
        return self.agents.get(name) or self.directory.specs.get(name)

    def _spec_of(self, name: str, allow_unregistered: bool) -> AgentSpec:
        """The agent's spec: the app's, else the live registry's, else (when allowed) the plain defaults."""
        spec = self.agents.get(name) or self.directory.specs.get(name)
        if spec is not None:
            return spec
        if allow_unregistered or self.limits.allow_unregistered:
            return AgentSpec(name)
        known = ", ".join(sorted(self.agents.keys() | self.directory.specs.keys())) or "none"
        raise UnknownAgent(
            f"unknown agent {shown(name)}: the app does not define it and no live worker serves it (known agents: "
            f"{known}); start a worker that serves it, or accept it for a worker not up yet with "
            "--allow-unregistered (TENURE_ALLOW_UNREGISTERED=1)"
        )

    async def _admit(self, job: NewJob) -> Admitted:
        try:
            if self.limits.tenant_budgets:
                await check_tenant_budgets(self.store, self.limits.tenant_budgets, [job.tenant])
            # The gate's read rides in the enqueue's own round trip (transaction on SQLite): `Gate.ask`.
            ask = self.gate.ask({(job.tenant, job.agent): 1})
            (job,), (out,) = await self.router.enqueue([job], ask)
            self.gate.admitted(ask)
        except (QueueFull, CircuitOpen):
            # A replay of a key answers its original job even while the caps or the circuit refuse new work:
            # the job exists, nothing new is admitted.
            replayed = await self._replayed(job)
            if replayed is None:
                raise
            return replayed
        if out.created:
            self._count_degraded([job])
        await self.hint([job], [out])
        return Admitted(out.job, out.created)

    def _count_degraded(self, jobs: Sequence[NewJob]) -> None:
        if self.on_degraded is None:
            return
        for j in jobs:
            if j.degraded_reason is not None:
                self.on_degraded(j.mode_requested or j.agent, j.degraded_reason)

    async def _replayed(self, job: NewJob) -> Admitted | None:
        if job.idem_digest is None:
            return None
        found = await self.store.find_idempotent(job.tenant, job.idem_digest)
        if found is None:
            return None
        job_id, fingerprint = found
        try:
            check_replay(job_id, fingerprint, job.request_fingerprint)
        except IdempotencyConflict as conflict:
            raise conflict from None  # the key's answer, not the refusal it stands in for
        existing = await self.store.get_job(job_id)
        return None if existing is None else Admitted(existing, False)

    async def hint(self, jobs: list[NewJob], enqueued: list[Enqueued]) -> None:
        """Publish ready hints for the jobs created now. The index is an accelerator: if it is down, workers
        find the jobs by polling the store, so a failure here is logged, never raised."""
        if self.ready_index is None:
            return
        # A job waiting for its concurrency key's turn is not claimable: it is hinted when its turn comes (the
        # sweeper's hints of jobs claimable again), and found by the store's claim either way.
        created = {e.job_id for e in enqueued if e.created and not e.job.key_wait}
        hints = [ReadyHint(j.id, j.agent, j.priority, j.preferred_worker) for j in jobs if j.id in created]
        try:
            # Bounded: the job is committed already, and a Redis that stopped answering (a partition) would
            # otherwise hold every submit for its socket timeout; the workers' store polling finds the job.
            async with asyncio.timeout(HINT_TIMEOUT_S):
                await self.ready_index.publish(hints)
        except (StoreUnavailable, TimeoutError) as exc:
            logging.getLogger("tenure.admission").warning(
                "ready index unavailable, workers will poll: %s", exc or f"no answer within {HINT_TIMEOUT_S:g} s"
            )


class InFlight:
    """Same-process duplicates of one idempotency digest share the first request's future; across processes
    the store's unique `(tenant, idem_digest)` answers."""

    def __init__(self) -> None:
        self._pending: dict[bytes, tuple[bytes, asyncio.Future[Admitted]]] = {}

    async def run(self, digest: bytes, fingerprint: bytes, submit: Callable[[], Awaitable[Admitted]]) -> Admitted:
        """The answer of `submit()`, run once for all concurrent callers with this digest."""
        held = self._pending.get(digest)
        if held is not None:
            first_fingerprint, fut = held
            result = await asyncio.shield(fut)
            check_replay(result.job.id, first_fingerprint, fingerprint)
            return Admitted(result.job, False)
        fut = asyncio.get_running_loop().create_future()
        self._pending[digest] = (fingerprint, fut)
        try:
            result = await submit()
        except BaseException as exc:
            # A leader that was cancelled (its client went away) answers its waiters "retry": the store
            # decides whether the job was created, and a retry with the same key gets that answer.
            fut.set_exception(
                exc
                if isinstance(exc, Exception)
                else StoreUnavailable("the first request with this idempotency key was abandoned; retry")
            )
            fut.exception()  # retrieved: waiters (if any) re-raise it; nobody is warned of an orphan
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            del self._pending[digest]

    def __len__(self) -> int:
        return len(self._pending)


def _spec_fields(req: JobRequest) -> dict[str, Any]:
    """A `JobRequest`'s job fields as `JobSpec` reads them. A Python caller may pass any sequence of tags (a
    tuple, a set); JSON's only sequence is a list, so they are given to the model as one (a str stays a str:
    "gpu" is not a list of tags)."""
    return {
        "agent": req.agent,
        "input": req.input,
        "priority": req.priority,
        "requires": _listed(req.requires),
        "deadline_s": req.deadline_s,
        "budget": None if req.budget is None else dict(req.budget),
        "max_attempts": req.max_attempts,
        "concurrency_key": req.concurrency_key,
        "multitask": req.multitask,
        "mode": req.mode,
        "prefers": _listed(req.prefers),
        "strict": req.strict,
    }


def _listed(tags: Any) -> Any:
    """A sequence of tags as a list for the model (a str, bytes or dict as it is: the model refuses it)."""
    if tags is not None and not isinstance(tags, str | bytes | dict):
        try:
            return list(tags)
        except TypeError:
            pass  # not iterable: the model refuses it
    return tags


def _input_json(value: Any) -> tuple[str, int]:
    """A job's input as stored (compact JSON) and its size in bytes, or `InvalidJSON` / `InvalidRequest`.
    Values from Python callers are held to the rules `parse_json` enforces on texts."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a ValueError too: test it first
        raise InvalidJSON(
            f"input holds a lone UTF-16 surrogate {lone_surrogate(exc)}, which is not a Unicode character"
        ) from None
    except RecursionError:
        raise InvalidJSON(f"input nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", kind="too-deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"input is not JSON-serializable: {exc}") from exc
    if holds_nul(text):
        raise InvalidJSON("input holds U+0000 (NUL), which a PostgreSQL store cannot hold in text", "nul-character")
    # Decoded again (only when it has enough brackets to be too deep): tuples, dict subclasses and the like
    # from Python callers are then walked exactly as the JSON the store will hold.
    if may_nest_deeper(text, MAX_JSON_DEPTH) and nesting_exceeds(json.loads(text), MAX_JSON_DEPTH):
        raise InvalidJSON(f"input nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", kind="too-deep")
    return text, size
