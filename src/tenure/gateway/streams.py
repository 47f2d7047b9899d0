"""Event streams for clients: history first, live tail second, no gap and no duplicate.

    EventHub      one per gateway process: the only reader of `Signals.wait_for_events`; fans notices out
    Subscription  one per client stream: a cursor (epoch, seq) that only moves forward

A subscription registers with the hub *before* it reads the history, so nothing appended in between is
missed. Live events (Postgres NOTIFY bodies) are delivered only when they continue the cursor exactly —
same epoch and seq + 1, or a newer epoch at seq 1 — otherwise they are dropped (duplicates, older epochs)
or trigger a read of the history from the cursor (a gap). On SQLite every notice means "read the history".
Because the cursor never moves back, an event of an older epoch never reaches a client once a newer epoch
was delivered. The stream ends after a terminal event `job.<state>` when the history holds nothing after it,
and at once when it starts at or past the end of a finished job (a client resuming after the terminal event, or
with a cursor beyond the last event): nothing will ever follow its cursor, so waiting would hang forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import JobStore, Signals
from tenure.contracts.types import Event, EventNotice

log = logging.getLogger("tenure.gateway.streams")

TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled", "job.lost", "job.expired", "job.dead"})
_HISTORY_PAGE = 1000
_MAX_PENDING = 5000  # live events buffered for a slow reader before it falls back to the history


def continues(cursor: tuple[int, int] | None, event: Event) -> bool:
    """Whether `event` is exactly the next one after `cursor` (a job's first event of an epoch is seq 1)."""
    if cursor is None:
        return event.seq == 1
    epoch, seq = cursor
    return (event.epoch == epoch and event.seq == seq + 1) or (event.epoch > epoch and event.seq == 1)


class Subscription:
    """One client's stream of one job. Iterate `batches()`; an empty batch means "idle" (send a keep-alive)."""

    def __init__(self, hub: EventHub, job_id: str, after: tuple[int, int] | None, idle_s: float) -> None:
        self.hub = hub
        self.job_id = job_id
        self.cursor = after
        self.idle_s = idle_s
        self._pending: list[Event] = []
        self._dirty = True
        self._primed = False  # has read its history once: from then on the hub may feed it
        self._wake = asyncio.Event()
        self.final_state: str | None = None
        """Once `batches()` has ended by itself: the job's terminal state (`succeeded`, ...), for the end frame."""

    @property
    def caught_up(self) -> bool:
        """Reading live: its own history read is done, so the hub's batched reads can feed it."""
        return self._primed and not self._dirty

    def poke(self) -> None:
        self._dirty = True
        self._wake.set()

    def push(self, events: list[Event]) -> None:
        if len(self._pending) + len(events) > _MAX_PENDING:
            self._pending.clear()
            self._dirty = True
        else:
            self._pending.extend(events)
        self._wake.set()

    def _take_live(self) -> list[Event]:
        out: list[Event] = []
        cursor = self.cursor
        pending, self._pending = sorted(self._pending, key=lambda e: (e.epoch, e.seq)), []
        for e in pending:
            if cursor is not None and (e.epoch, e.seq) <= cursor:
                continue  # already delivered (from history or an earlier notice)
            if not continues(cursor, e):
                self._dirty = True  # a gap: the history fills it
                break
            out.append(e)
            cursor = (e.epoch, e.seq)
        return out

    async def _ended_before(self) -> bool:
        """Whether the job is finished and nothing follows this stream's cursor. The job is read before the
        events, so a terminal event appended in between is found (and delivered) rather than skipped."""
        store = self.hub.store
        job = await store.get_job(self.job_id)
        if job is not None and not job.state.terminal:
            return False
        if await store.read_events(self.job_id, self.cursor, 1):
            self._dirty = True  # something came after all (the terminal event, a requeue): read it
            return False
        self.final_state = job.state.value if job is not None else None
        return True

    async def batches(self) -> AsyncIterator[list[Event]]:
        store = self.hub.store
        last_type: str | None = None
        self.hub.add(self)
        try:
            while True:
                self._wake.clear()
                batch: list[Event] = []
                if self._dirty:
                    self._dirty = False
                    try:
                        batch = await store.read_events(self.job_id, self.cursor, _HISTORY_PAGE)
                        # Nothing delivered yet, so the cursor is the client's own: at or past the end of a
                        # finished job, no terminal event will ever come through this stream to end it.
                        if not batch and last_type is None and await self._ended_before():
                            return
                    except StoreUnavailable as exc:
                        log.warning("reading the history of %s failed, retrying: %s", self.job_id, exc)
                        self._dirty = True
                        await asyncio.sleep(0.5)
                        continue
                    if len(batch) == _HISTORY_PAGE:
                        self._dirty = True
                    else:
                        self._primed = True
                    if not batch and last_type in TERMINAL_EVENTS:
                        self.final_state = last_type.removeprefix("job.")
                        return  # the terminal event was the last: the stream is complete
                else:
                    batch = self._take_live()
                if batch:
                    self.cursor = (batch[-1].epoch, batch[-1].seq)
                    last_type = batch[-1].type
                    if last_type in TERMINAL_EVENTS:
                        self._dirty = True  # end only if the history holds nothing after it
                    yield batch
                    continue
                if self._dirty or self._pending:
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), self.idle_s)
                except TimeoutError:
                    self._dirty = True  # the floor: a lost notice costs at most one idle interval
                    yield []
        finally:
            self.hub.remove(self)


class EventHub:
    """Fans the store's event notices out to the subscriptions of this process."""

    def __init__(self, store: JobStore, signals: Signals, idle_s: float = 5.0) -> None:
        self.store = store
        self.signals = signals
        self.idle_s = idle_s
        self._subs: dict[str, set[Subscription]] = {}

    def subscribe(self, job_id: str, after: tuple[int, int] | None) -> Subscription:
        return Subscription(self, job_id, after, self.idle_s)

    def add(self, sub: Subscription) -> None:
        self._subs.setdefault(sub.job_id, set()).add(sub)

    def remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.job_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.job_id]

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())

    async def dispatch(self, notice: EventNotice) -> None:
        """Hand a notice's events to the subscribers of their jobs; a notice without events (SQLite, a
        reference over NOTIFY's limit) becomes one batched history read for every caught-up subscriber."""
        if notice.events:
            assert notice.job_ids is not None
            for job_id in notice.job_ids:
                events = [e for e in notice.events if e.job_id == job_id]
                for sub in self._subs.get(job_id, ()):
                    sub.push(events)
            return
        await self._catch_up(notice.job_ids)

    async def _catch_up(self, job_ids: frozenset[str] | None) -> None:
        # One read for all the streams of this process, not one per stream: with many live streams each
        # change of the database would otherwise cost as many queries as there are subscribers.
        subs = [s for jid, ss in self._subs.items() if job_ids is None or jid in job_ids for s in ss]
        live = [s for s in subs if s.caught_up]
        for s in subs:
            if not s.caught_up:
                s.poke()  # still reading its own history: it will see everything there
        if not live:
            return
        cursors = sorted({(s.job_id, s.cursor) for s in live}, key=lambda c: (c[0], c[1] or (-1, -1)))
        try:
            events = await self.store.read_events_many(cursors, _HISTORY_PAGE)
        except StoreUnavailable:
            for s in live:
                s.poke()
            return
        by_job: dict[str, list[Event]] = {}
        for e in events:
            by_job.setdefault(e.job_id, []).append(e)
        full = {j for j, evs in by_job.items() if len(evs) >= _HISTORY_PAGE}
        for s in live:
            if s.job_id in full:
                s.poke()  # far behind: let it page through the history itself
            elif s.job_id in by_job:
                s.push(by_job[s.job_id])

    async def run(self) -> None:
        """Forever: wait for notices and dispatch them. A store failure makes every subscriber re-read."""
        while True:
            try:
                notices = await self.signals.wait_for_events(1.0)
            except StoreUnavailable as exc:
                log.warning("event notices unavailable, subscribers poll the history: %s", exc)
                await asyncio.sleep(0.5)
                notices = [EventNotice(None)]
            if any(n.job_ids is None and not n.events for n in notices):
                notices = [n for n in notices if n.events] + [EventNotice(None)]  # one catch-up covers all
            for n in notices:
                await self.dispatch(n)
