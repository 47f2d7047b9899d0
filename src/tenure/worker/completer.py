"""The completer: every write an execution makes after its start goes through it, in batches.

    append(event)      queue a fenced event append (an execution's `ctx.emit`)
    record(record)     queue a fenced audit record (a tool call, evidence, usage): written with the events
    flush()            a future done once everything appended before it is durable
    finish(finish)     queue a finish CAS; a future that answers whether it matched
    claim_and_start()  the claim loop's one-step claim, which may carry the pending finishes

Group commit for one worker (model: River's `internal/jobcompleter`, a completer injected into the executor):
whatever events and finishes are pending when a round trip can start go together — events first, so a job's
history is complete before its finish, then finishes. When nobody waits on a write, it lingers a few ms so
that the finishes of jobs ending in the next moments share its commit.

On a store whose cost is commits and writer turns (SQLite: `claim_carries_finishes`), the next claim carries
the pending finishes in its own transaction (`finish_and_claim`: the finish CAS, then the claim and start, one
commit). That hand-over lives here and nowhere else: the claim loop asks the completer to claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from tenure.contracts.audit import AuditRecord
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import Store
from tenure.contracts.types import Claim, Finish, NewEvent, Started

log = logging.getLogger("tenure.worker")

_Pending = list[tuple[Finish, "asyncio.Future[bool]"]]


class Completer:
    """One worker's batched writes (see the module docstring). `run()` is a child of the worker's task group."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        on_rejected: Callable[[str], None],
        *,
        linger_s: float = 0.0,
        full: int = 1,
        busy: Callable[[], bool] = lambda: True,
        claim_soon: Callable[[], bool] = lambda: False,
    ) -> None:
        """`on_rejected(job_id)`: an append matched no row (the execution lost its job). `full`: this many
        pending finishes are worth a round trip without lingering. `busy()`: are other jobs still running,
        whose finishes could join a lingering write? `claim_soon()`: is the claim loop about to claim (the
        claim that carries pending finishes, where the store writes both in one commit)?"""
        self._store = store
        self._carry = store.claim_carries_finishes
        self._linger_s = linger_s
        self._full = full
        self._busy = busy
        self._claim_soon = claim_soon
        self._left = False  # the pending finishes were left to a claim once: the next pass writes them
        self._worker_id = worker_id
        self._on_rejected = on_rejected
        self._events: list[NewEvent] = []
        self._records: list[AuditRecord] = []
        self._flushes: list[asyncio.Future[None]] = []
        self._finishes: _Pending = []
        self._events_in_flight = False  # an append_events round trip is out: no finish may overtake it
        self._wake = asyncio.Event()
        self._closing = False

    def append(self, event: NewEvent) -> None:
        self._events.append(event)
        self._wake.set()

    def record(self, record: AuditRecord) -> None:
        self._records.append(record)
        self._wake.set()

    def flush(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushes.append(fut)
        self._wake.set()
        return fut

    def finish(self, finish: Finish) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._finishes.append((finish, fut))
        self._wake.set()
        return fut

    def idle(self) -> bool:
        return not (self._events or self._records or self._flushes or self._finishes)

    async def claim_and_start(
        self, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        """The claim CAS and the start CAS in one round trip; where the store writes finishes and a claim in one
        commit, the pending finishes go along (never while events are pending or being written: a job's events
        are written before its finish)."""
        taken = self._take_finishes() if self._carry else []
        if not taken:
            return await self._store.claim_and_start(self._worker_id, agents, capabilities, limit, ttl_s)
        try:
            done, pairs = await self._store.finish_and_claim(
                self._worker_id, [f for f, _ in taken], agents, capabilities, limit, ttl_s
            )
        except BaseException:
            # Not committed: the writer writes these itself (a finish is idempotent).
            self._finishes[:0] = taken
            self._wake.set()
            raise
        _settle(taken, done)
        return pairs

    def _take_blocked(self) -> bool:
        """May a claim not carry the pending finishes now (events go first; a flush or a close waits on them)?"""
        return bool(
            self._events or self._records or self._events_in_flight or self._flushes or self._closing or not self._finishes
        )

    def _take_finishes(self) -> _Pending:
        if self._take_blocked():
            return []
        taken, self._finishes = self._finishes, []
        return taken

    async def run(self) -> None:
        retry_delay = 0.05
        while True:
            if self.idle():
                self._left = False  # the claim took what was left to it
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._left and self._carry and self._linger_s > 0 and self._claim_soon() and not self._take_blocked():
                # Only finishes are pending, and the claim loop, woken by the slots they freed, is a few loop
                # steps from its claim: leave them to it (one commit for both), once; whatever it has not taken
                # after one linger is written next, so a finish waits at most that long for a claim.
                self._left = True
                await asyncio.sleep(self._linger_s)
                continue
            self._left = False
            if (
                self._linger_s > 0
                and not (self._flushes or self._closing)
                and len(self._finishes) < self._full
                and self._busy()
            ):
                # Nobody waits on this write: let the finishes of jobs ending in the next moments share its
                # round trip and commit (batches of ~6 grow to ~15 in a drain; a result shows up that much later).
                # With no other job running there is nothing to wait for: an idle worker writes at once, so its
                # commit does not land on the pickup of the next job.
                await asyncio.sleep(self._linger_s)
            events, records, flushes, finishes = self._events, self._records, self._flushes, self._finishes
            self._events, self._records, self._flushes, self._finishes = [], [], [], []
            try:
                if events or records:
                    self._events_in_flight = True
                    try:
                        # Audit records ride with the events (one round trip); without any, the plain append.
                        append = self._store.append_audit(records, events) if records else self._store.append_events(events)
                        for job_id in await append:
                            self._on_rejected(job_id)
                    finally:
                        self._events_in_flight = False
                for flushed in flushes:
                    if not flushed.done():
                        flushed.set_result(None)
                if finishes:
                    _settle(finishes, await self._store.finish(self._worker_id, [f for f, _ in finishes]))
                retry_delay = 0.05
            except Exception as exc:
                # Keep everything and try again: appends are idempotent (ON CONFLICT DO NOTHING), and a finish
                # that committed before the error is recognised by the caller. Values no store accepts never get
                # here (`dumps`, `clean_text` refuse them in the execution that made them).
                if isinstance(exc, StoreUnavailable):
                    log.warning("store unavailable while writing, retrying in %.2fs: %s", retry_delay, exc)
                else:
                    log.exception("writing events and finishes failed, retrying in %.2fs", retry_delay)
                self._events[:0], self._flushes[:0], self._finishes[:0] = events, flushes, finishes
                self._records[:0] = records
                await asyncio.sleep(retry_delay)
                retry_delay = min(retry_delay * 2, 2.0)

    async def close(self) -> None:
        """Write what is pending, then let `run()` return."""
        self._closing = True
        self._wake.set()


def _settle(taken: _Pending, done: Iterable[str]) -> None:
    matched = set(done)
    for f, fut in taken:
        if not fut.done():
            fut.set_result(f.fence.job_id in matched)
