"""`ChannelSignals`: the `Signals` protocol with its events and control hints over a `Channel` (Redis pub/sub)
instead of the database.

Two hints leave a process when something changed that another process is waiting for:

    events    a job's history grew (a gateway's event streams read it)     topic `events`,  body `id,id,...`
    control   a job got a cancel request or a command (its owner acts)     topic `control`, body `id,id,...`

Without Redis, PostgreSQL carries them as NOTIFY (whose commit-time lock serialises every notifying commit of
the cluster) and SQLite as polling of `PRAGMA data_version`. With `TENURE_REDIS_URL` set, the store writes no
NOTIFY for them and `ChannelSignals` publishes the hints after the write committed, from a background task, so a
write never waits on Redis. Hints carry job ids, not events: the reader goes to the history, in one batched read
for all its streams, so a hint can never show an event the history does not hold.

The third hint, "jobs became claimable", stays with the database's own signals (`jobs`: NOTIFY on PostgreSQL,
the doorbell on SQLite): with Redis, the ready index (`RedisReadyIndex`) is what wakes workers first, and the
database's wake-up is its floor.

Redis is the accelerator, never the truth. A subscriber that loses its subscription (Redis restarted, the
connection cut) tells its reader "anything may have changed" and then every `down_poll_s` until it is subscribed
again — the reader polls the history meanwhile, and the worker's heartbeat reply keeps carrying the cancel flags
— and it resubscribes with a growing delay. Once subscribed again it says "anything may have changed" once more,
for what was published while it was away. A hint that fails to publish is dropped (logged once per outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tenure.contracts.channel import Channel
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import Signals
from tenure.contracts.types import EventNotice

log = logging.getLogger("tenure.signals")

EVENTS_TOPIC = "events"
CONTROL_TOPIC = "control"
_MAX_IDS_PER_MESSAGE = 200  # ~7.4 KB of ids: a burst of changes becomes a few bounded messages


class _Feed:
    """The receiving side of one topic: the job ids hinted since the last take (None: check every job)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.jobs: set[str] | None = set()
        self.ready = asyncio.Event()
        self.subscribed = False
        self.task: asyncio.Task[None] | None = None

    def on_subscribed(self) -> None:
        if not self.subscribed:
            self.subscribed = True
            self.everything()  # whatever was published before the subscription was in place

    def on_lost(self) -> None:
        self.subscribed = False
        self.everything()

    def everything(self) -> None:
        self.jobs = None
        self.ready.set()

    def add(self, ids: Iterable[str]) -> None:
        if self.jobs is not None:
            self.jobs.update(i for i in ids if i)
        self.ready.set()

    def take(self) -> frozenset[str] | None:
        self.ready.clear()
        jobs, self.jobs = self.jobs, set()
        return None if jobs is None else frozenset(jobs)


class ChannelSignals:
    """Publish and receive the `events` and `control` hints on a `Channel`; jobs wake-ups through `jobs`, the
    database's own signals. Owns both: `close` closes the channel and `jobs`."""

    def __init__(self, channel: Channel, jobs: Signals, *, down_poll_s: float = 1.0, retry_max_s: float = 5.0) -> None:
        self.channel = channel
        self._jobs = jobs
        self.down_poll_s = down_poll_s
        self.retry_max_s = retry_max_s
        self._events = _Feed(EVENTS_TOPIC)
        self._control = _Feed(CONTROL_TOPIC)
        self._outbox: dict[str, set[str]] = {EVENTS_TOPIC: set(), CONTROL_TOPIC: set()}
        self._outbox_ready = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        self._publish_failing = False
        self._closed = False

    # -- publishing ---------------------------------------------------------------------------------------------
    def jobs_changed(self) -> None:
        """Jobs became claimable: the database's signals tell the workers."""
        self._jobs.jobs_changed()

    def events_changed(self, job_ids: Iterable[str]) -> None:
        """These jobs' histories grew (call after the write committed). Never blocks, never raises."""
        self._post(EVENTS_TOPIC, job_ids)

    def control_sent(self, job_ids: Iterable[str]) -> None:
        """These jobs got a cancel request or a command (call after the write committed)."""
        self._post(CONTROL_TOPIC, job_ids)

    def _post(self, topic: str, job_ids: Iterable[str]) -> None:
        if self._closed:
            return
        box = self._outbox[topic]
        before = len(box)
        box.update(job_ids)
        if len(box) == before:
            return
        self._outbox_ready.set()
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish_loop(), name="signals-publisher")

    async def _publish_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            await self._flush()

    async def _flush(self) -> None:
        self._outbox_ready.clear()
        for topic, box in self._outbox.items():
            if not box:
                continue
            ids = sorted(box)
            box.clear()
            for i in range(0, len(ids), _MAX_IDS_PER_MESSAGE):
                try:
                    await self.channel.publish(topic, ",".join(ids[i : i + _MAX_IDS_PER_MESSAGE]))
                except StoreUnavailable as exc:
                    if not self._publish_failing:
                        log.warning("publishing %s hints failed, readers fall back to polling: %s", topic, exc)
                    self._publish_failing = True
                    break  # dropped: subscribers poll while Redis is away
                else:
                    if self._publish_failing:
                        log.info("publishing %s hints works again", topic)
                    self._publish_failing = False

    # -- receiving ----------------------------------------------------------------------------------------------
    async def wait_for_jobs(self, timeout_s: float) -> None:
        """The database's wait for claimable jobs."""
        await self._jobs.wait_for_jobs(timeout_s)

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        """`Signals.wait_for_events` over the channel."""
        jobs = await self._wait(self._events, timeout_s)
        if jobs is None:
            return [EventNotice(None)]
        return [EventNotice(jobs)] if jobs else []

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        """`Signals.wait_for_control` over the channel."""
        return await self._wait(self._control, timeout_s)

    async def _wait(self, feed: _Feed, timeout_s: float) -> frozenset[str] | None:
        if feed.task is None and not self._closed:
            feed.task = asyncio.get_running_loop().create_task(self._listen(feed), name=f"signals-{feed.topic}")
        if not feed.ready.is_set():
            # Unsubscribed: the reader polls (an answer of "anything") at least every down_poll_s.
            wait_s = timeout_s if feed.subscribed else min(timeout_s, self.down_poll_s)
            try:
                await asyncio.wait_for(feed.ready.wait(), wait_s)
            except TimeoutError:
                if feed.subscribed:
                    return frozenset()
                feed.everything()
        return feed.take()

    async def _listen(self, feed: _Feed) -> None:
        delay = 0.1
        while not self._closed:
            try:
                async for _topic, message in self.channel.subscribe([feed.topic], on_subscribed=feed.on_subscribed):
                    feed.add(message.split(","))
                    delay = 0.1
            except StoreUnavailable as exc:
                if feed.subscribed:
                    log.warning("%s hints lost (%s); polling until resubscribed", feed.topic, exc)
            except Exception:  # a driver surprise must not end the subscription for good: poll, then retry
                log.exception("%s hints failed unexpectedly; polling until resubscribed", feed.topic)
            feed.on_lost()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    async def close(self) -> None:
        """Send what is still in the outbox (bounded), stop listening, close the channel and the database's
        signals. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if any(self._outbox.values()):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        await self._flush()
            for task in (self._publisher, self._events.task, self._control.task):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.channel.close()
        finally:
            await self._jobs.close()


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Signals] = ChannelSignals
