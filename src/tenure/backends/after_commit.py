"""`AfterCommit`: the `JobStore` every caller uses — each write of a dialect's store, then the `Signals` call that
tells other processes of it, with what the write returned. What happens after a commit is written here once,
above the dialects, instead of once per store and per transport.

    a write that ...                                         signals
    makes jobs claimable: enqueue (a new job), requeue,      jobs_changed()
      release_claims, a sweep that released, requeued or
      found due jobs
    appends to histories: start, claim_and_start, finish,    events_changed(those jobs)
      finish_and_claim, append_events, set_waiting, requeue,
      a sweep's lost / requeued / dead / expired jobs, a
      cancel that cancelled at once
    flags a job for its owner: a cancel request, a command   control_sent(that job)

A signal is sent only for a write that changed something, after it returned (committed). On PostgreSQL the
signals' publishing half is a no-op for what the SQL already notified inside the transaction
(`postgres/signals.py`); this wrapper calls it all the same, so that the rule above stays the one place that
says which write wakes whom, whatever the transport. Reads and the other writes pass straight through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tenure.contracts.audit import AuditRecord, BudgetUse, StepRecord, StoredRecord
from tenure.contracts.children import ChildJob
from tenure.contracts.profile import JobRoute, WorkerRecord
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk, StoreHealth, WaitingInfo
from tenure.contracts.states import WorkerState
from tenure.contracts.store import JobStore, OffloadStats, Signals
from tenure.contracts.types import (
    Claim,
    Command,
    ControlOutcome,
    Enqueued,
    Event,
    Execution,
    Fence,
    Finish,
    HeartbeatReply,
    Job,
    JobCounts,
    JobFilter,
    NewEvent,
    NewJob,
    Start,
    Started,
    SweepReport,
    WorkerInfo,
)

T = TypeVar("T")


class AfterCommit:
    """`store`'s writes followed by `signals`' publishing half. Closing it closes `store`; the signals are closed
    by their owner (`Backends.close`, before the store whose connections they may share)."""

    def __init__(self, store: JobStore, signals: Signals) -> None:
        self.store = store
        self.signals = signals

    @property
    def dialect(self) -> str:
        return self.store.dialect

    @property
    def offload(self) -> OffloadStats | None:
        return self.store.offload

    @property
    def claim_carries_finishes(self) -> bool:
        return self.store.claim_carries_finishes

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def migrate(self) -> int:
        return await self.store.migrate()

    async def schema_version(self) -> int:
        return await self.store.schema_version()

    def latest_schema_version(self) -> int:
        return self.store.latest_schema_version()

    async def server_time(self) -> float:
        return await self.store.server_time()

    async def server_version(self) -> str:
        return await self.store.server_version()

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        return await self.store.run_between_transactions(fn)

    async def close(self) -> None:
        await self.store.close()

    # -- admission -----------------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob], gate: GateAsk | None = None) -> list[Enqueued]:
        out = await self.store.enqueue(jobs, gate)
        if any(e.created for e in out):
            self.signals.jobs_changed()
        interrupted = [j for e in out for j in e.interrupted]
        if interrupted:  # cancel requests for the owners (interrupt), as `cancel` signals them
            self.signals.control_sent(interrupted)
        return out

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        return await self.store.get_job(job_id, tenant)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        return await self.store.list_jobs(flt)

    async def job_route(self, job_id: str) -> JobRoute | None:
        return await self.store.job_route(job_id)

    async def requeue(self, job_id: str, tenant: str | None = None, input_json: str | None = None) -> Job:
        job = await self.store.requeue(job_id, tenant, input_json)  # raises unless it was requeued
        self.signals.jobs_changed()
        self.signals.events_changed([job_id])
        return job

    # -- ownership -----------------------------------------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        return await self.store.claim(worker_id, agents, capabilities, limit, ttl_s)

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        pairs = await self.store.claim_and_start(worker_id, agents, capabilities, limit, ttl_s)
        if pairs:
            self.signals.events_changed([s.fence.job_id for _, s in pairs])
        return pairs

    async def finish_and_claim(
        self,
        worker_id: str,
        finishes: Sequence[Finish],
        agents: Sequence[str],
        capabilities: Sequence[str],
        limit: int,
        ttl_s: float,
    ) -> tuple[list[str], list[tuple[Claim, Started]]]:
        done, pairs = await self.store.finish_and_claim(worker_id, finishes, agents, capabilities, limit, ttl_s)
        if done or pairs:
            self.signals.events_changed([*done, *(s.fence.job_id for _, s in pairs)])
        return done, pairs

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        started = await self.store.start(worker_id, starts)
        if started:
            self.signals.events_changed([s.fence.job_id for s in started])
        return started

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        done = await self.store.finish(worker_id, finishes)
        if done:
            self.signals.events_changed(done)
        return done

    async def append_events(self, events: Sequence[NewEvent]) -> set[str]:
        rejected = await self.store.append_events(events)
        written = {e.fence.job_id for e in events} - rejected
        if written:
            self.signals.events_changed(written)
        return rejected

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        released = await self.store.release_claims(worker_id, fences)
        if released:
            self.signals.jobs_changed()
        return released

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float,
        record: WorkerRecord | None = None,
    ) -> HeartbeatReply:  # fmt: skip
        return await self.store.heartbeat(worker_id, state, in_flight, held, ttl_s, record)

    # -- registry ------------------------------------------------------------------------------------------------
    async def register_worker(self, info: WorkerInfo) -> None:
        await self.store.register_worker(info)

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        await self.store.set_worker_state(worker_id, state)

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        return await self.store.list_workers(include_gone)

    async def request_drain(self, worker_id: str, timeout_s: float | None) -> WorkerInfo | None:
        return await self.store.request_drain(worker_id, timeout_s)

    async def registry_agents(self) -> list[WorkerInfo]:
        return await self.store.registry_agents()

    # -- history -------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        return await self.store.read_events(job_id, after, limit)

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        return await self.store.read_events_many(cursors, limit)

    async def list_executions(self, job_id: str) -> list[Execution]:
        return await self.store.list_executions(job_id)

    # -- the sweeper duty ----------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        report = await self.store.sweep(worker_ttl_s)
        grew = report.lost + report.requeued + report.dead + report.expired
        if grew:
            self.signals.events_changed(grew)
        if report.released or report.requeued or report.due:
            self.signals.jobs_changed()
        return report

    async def count_live_jobs(self) -> JobCounts:
        return await self.store.count_live_jobs()

    async def health(self) -> StoreHealth:
        return await self.store.health()

    # -- the gateway's side --------------------------------------------------------------------------------------
    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float, upto: int | None = None
    ) -> AdmissionState:
        return await self.store.admission_state(tenant, circuit_key, threshold, window_s, open_s, upto)

    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        return await self.store.queue_depth(tenant)

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        return await self.store.find_idempotent(tenant, idem_digest)

    async def queued_of_agent(self, agent: str, mode: str | None = None) -> int:
        return await self.store.queued_of_agent(agent, mode)

    async def waiting_info(
        self, job_id: str, bound: int, queue_cap: int | None = None, cap_per_mode: bool = False
    ) -> WaitingInfo | None:
        return await self.store.waiting_info(job_id, bound, queue_cap, cap_per_mode)

    async def record_circuit_failure(self, key: str) -> None:
        await self.store.record_circuit_failure(key)

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        return await self.store.circuit_state(key, threshold, window_s, open_s)

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        outcome = await self.store.cancel(job_id, tenant)
        if outcome is ControlOutcome.ACCEPTED:  # cancelled at once: its terminal event was appended
            self.signals.events_changed([job_id])
        elif outcome is ControlOutcome.REQUESTED:  # the owner's fast path; its heartbeat reply is the floor
            self.signals.control_sent([job_id])
        return outcome

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        outcome = await self.store.send_command(job_id, tenant, kind, payload_json)
        if outcome is ControlOutcome.REQUESTED:
            self.signals.control_sent([job_id])
        return outcome

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        return await self.store.read_commands(job_id, after_seq)

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        moved = await self.store.set_waiting(event, waiting)
        if moved:
            self.signals.events_changed([event.fence.job_id])
        return moved

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        return await self.store.control_state(job_ids)

    async def children(self, job_id: str) -> list[ChildJob]:
        return await self.store.children(job_id)

    # -- the audit chain and the journal ----------------------------------------------------------------------------
    async def append_audit(self, records: Sequence[AuditRecord], events: Sequence[NewEvent]) -> set[str]:
        rejected = await self.store.append_audit(records, events)
        written = {e.fence.job_id for e in events} - rejected
        if written:
            self.signals.events_changed(written)
        return rejected

    async def read_audit(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[StoredRecord]:
        return await self.store.read_audit(job_id, after, limit)

    async def audit_usage(self, job_id: str) -> dict[str, float]:
        return await self.store.audit_usage(job_id)

    async def read_budget(self, job_id: str) -> BudgetUse | None:
        return await self.store.read_budget(job_id)

    async def purge_finished(
        self, older_than_s: float, limit: int, by_tenant: Mapping[str, float] | None = None
    ) -> list[str]:
        return await self.store.purge_finished(older_than_s, limit, by_tenant)

    async def usage_report(self, from_s: float, to_s: float, group_by: str, tenant: str | None) -> list[dict[str, Any]]:
        return await self.store.usage_report(from_s, to_s, group_by, tenant)

    async def read_steps(self, job_id: str) -> list[StepRecord]:
        return await self.store.read_steps(job_id)

    async def begin_step(self, fence: Fence, execution_id: str, key: str) -> StepRecord | None:
        return await self.store.begin_step(fence, execution_id, key)

    async def end_step(self, fence: Fence, execution_id: str, key: str, result_json: str) -> bool:
        return await self.store.end_step(fence, execution_id, key, result_json)

    async def resolve_step(self, fence: Fence, key: str, result_json: str) -> bool:
        return await self.store.resolve_step(fence, key, result_json)

    async def clear_step(self, fence: Fence, execution_id: str, key: str) -> bool:
        return await self.store.clear_step(fence, execution_id, key)


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[JobStore] = AfterCommit
