"""A coordinator's event stream with its children's: `GET /v1/jobs/{id}/events?include=children`
(docs/coordinators.md).

The coordinator's own events travel exactly as on its plain stream (`id: EPOCH-SEQ`, `event: <type>`, history then
live tail, no gap and no duplicate, resumable with `Last-Event-ID`). Its children's events are interleaved as
`event: child` frames whose `data` is the child's event envelope (its `job_id` says whose), read from the store
at most every `FAMILY_POLL_S`: children that appear while the stream runs are picked up at the next read. A child
frame carries no `id:`, so `Last-Event-ID` stays the coordinator's cursor; a reconnected stream replays each
child's history from its first event (deduplicate by `job_id`, `execution_id` and `seq`). The stream ends with the
coordinator's terminal event, after one last read of its children's events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import JobStore
from tenure.contracts.text import dumps
from tenure.contracts.types import Event
from tenure.gateway.streams import EventHub, Subscription

log = logging.getLogger("tenure.gateway.streams")

FAMILY_POLL_S = 0.5
"""How often a family stream reads its children's new events (and how long its own tail waits idle)."""
_PAGE = 1000
_KEEP_ALIVE_S = 5.0


class ChildEvents:
    """The children of one coordinator and a cursor in each one's history."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        self.cursors: dict[str, tuple[int, int] | None] = {}

    async def read(self) -> list[Event]:
        """The children's events after their cursors (new children from their first event); [] if the store
        does not answer now (the next read catches up)."""
        try:
            for child in await self.store.children(self.job_id):
                self.cursors.setdefault(child.id, None)
            if not self.cursors:
                return []
            events = await self.store.read_events_many(sorted(self.cursors.items(), key=lambda c: c[0]), _PAGE)
        except StoreUnavailable as exc:
            log.warning("reading the children of %s failed, retrying: %s", self.job_id, exc)
            return []
        for e in events:  # in cursor order within each child: the last one is its new cursor
            self.cursors[e.job_id] = (e.epoch, e.seq)
        return events


def _child_frames(events: list[Event]) -> str:
    return "".join(f"event: child\ndata: {dumps(e.to_dict())}\n\n" for e in events)


async def family_sse(hub: EventHub, job_id: str, after: tuple[int, int] | None) -> AsyncIterator[str]:
    """The SSE text of a coordinator's stream with its children's (see the module docstring)."""
    sub = Subscription(hub, job_id, after, FAMILY_POLL_S)  # its idle floor is the children's poll
    kids = ChildEvents(hub.store, job_id)
    yield f": stream of job {job_id} with its children\n\n"
    read_at = sent_at = time.monotonic()
    async for batch in sub.batches():
        out = "".join(f"id: {e.cursor}\nevent: {e.type}\ndata: {dumps(e.to_dict())}\n\n" for e in batch)
        now = time.monotonic()
        if now - read_at >= FAMILY_POLL_S or not batch:
            read_at = now
            out += _child_frames(await kids.read())
        if out:
            sent_at = now
            yield out
        elif now - sent_at >= _KEEP_ALIVE_S:
            sent_at = now
            yield ": keep-alive\n\n"
    last = _child_frames(await kids.read())  # what the children wrote up to the coordinator's end
    if last:
        yield last
