"""Global quotas as named leases: `async with ctx.quota("llm:gpt-4o"):` in a handler.

    QuotaManager        one per worker process: the configured limits, every lease the process holds, one
                        renewal round trip per heartbeat, the fail-closed short circuit, the wake-ups
    ExecutionQuotas     one per execution: hands out holder ids `<execution id>:<slot>`, pauses and resumes
    QuotaBlock          one `async with`: acquire on enter, release on exit, LeaseLost if the lease was lost

Fairness (`wait=True`): a caller that finds the quota full takes a ticket in the key's waiting line, itself a
lease on `<key>#wait` named by a time-ordered id, renewed with the others, so a waiter that dies leaves the
line on its own. Only the waiters at the head of the line — as many as there are free slots — try to take a
slot, so a released slot goes to the oldest waiter across all workers. Waiters are woken by a message: at
once in the releasing process, over the `Channel` (topic `quota:<key>`) in the others, and by polling as
the floor when no channel is configured or a message is lost.

Fencing: when a renewal reports a lease lost, the task inside the holding block is cancelled and the block
raises `LeaseLost`: the slot may already belong to someone else, so no upstream call continues on it.

Failure policy per key: `fail-closed` (default) raises `QuotaUnavailable` and short-circuits the backend
for `breaker_s` seconds; `fail-open` lets the call through without a lease and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import TracebackType

from tenure.contracts.channel import Channel
from tenure.contracts.errors import (
    ConfigError,
    LeaseLost,
    LeasesUnavailable,
    QuotaExhausted,
    QuotaUnavailable,
    StoreUnavailable,
)
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.store import LeaseRef, Leases
from tenure.contracts.types import new_id

log = logging.getLogger("tenure.quotas")

WAIT_SUFFIX = "#wait"
"""The waiting line of quota `k` is the lease key `k#wait` (quota keys cannot contain `#`)."""
_LINE_LIMIT = 1_000_000
"""The waiting line is unbounded in practice: tickets are leases only so that a dead waiter's expires."""


def _reraise_cancellation() -> None:
    """A cancellation that arrives during a redis-py command is sometimes absorbed by the driver (the command
    returns or fails as a connection error): a background loop checks that it was not asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def quota_topic(key: str) -> str:
    """The channel topic on which releases of `key` are announced."""
    return f"quota:{key}"


class _Hold:
    """One lease this process holds (a slot, or a ticket in a waiting line) and whom to tell if it is lost."""

    __slots__ = ("on_lost", "ref")

    def __init__(self, ref: LeaseRef, on_lost: Callable[[], None]) -> None:
        self.ref = ref
        self.on_lost = on_lost


class QuotaManager:
    """The quota side of one worker process. See the module docstring."""

    def __init__(
        self,
        leases: Leases,
        specs: Mapping[str, QuotaSpec],
        *,
        ttl_s: float,
        channel: Channel | None = None,
        poll_s: float = 0.5,
        breaker_s: float = 3.0,
    ) -> None:
        if not ttl_s > 0:
            raise ConfigError(f"quota lease TTL must be positive, not {ttl_s}")
        self.leases = leases
        self.specs = dict(specs)
        self.ttl_s = ttl_s
        self.channel = channel
        self.poll_s = poll_s
        self.breaker_s = breaker_s
        self._held: dict[LeaseRef, _Hold] = {}
        self._waiters: dict[str, dict[str, asyncio.Future[bool]]] = {}  # key → ticket → its wake-up
        self._my_tickets: set[str] = set()  # tickets of this process's waiters
        self._handed: set[str] = set()  # tickets told "go" while they were not asleep
        self._handing_over = False  # run() is active: releases are handed over by its announcer
        # A wake-up that found no sleeping waiter (they were all busy checking) is kept as a permit: the next
        # waiter about to sleep checks again instead, so no release is missed until the polling floor, and
        # one release never sets a whole herd of waiters re-reading the line.
        self._permits: Counter[str] = Counter()
        # Releases to announce on the channel, published by `run()` so that a release never waits for it.
        self._to_announce: set[str] = set()
        self._announce = asyncio.Event()
        self._down_until = 0.0
        self._last_renewed = time.monotonic()
        self.fail_open_admitted: Counter[str] = Counter()
        """Calls let through without a lease because the backend was down (fail-open keys), by key."""
        self.rejected: Counter[str] = Counter()
        """QuotaExhausted and QuotaUnavailable answers, by key."""
        self.rejections: Counter[tuple[str, str]] = Counter()
        """The same by (key, reason): `full` (wait=False), `timeout` (waited too long), `unavailable`."""

    # -- configuration ---------------------------------------------------------------------------------------
    def spec(self, key: str) -> QuotaSpec:
        """The configured spec of `key`; an unconfigured key is a `ConfigError` (no silent unlimited)."""
        spec = self.specs.get(key)
        if spec is None:
            known = ", ".join(sorted(self.specs)) or "none"
            raise ConfigError(
                f"quota {key!r} is not configured (TENURE_QUOTAS / tenure.toml; known: {known})"
            )
        return spec

    def for_execution(self, execution_id: str) -> ExecutionQuotas:
        """The quotas of one execution; its holder ids are `<execution_id>:<slot>`."""
        return ExecutionQuotas(self, execution_id)

    @property
    def held(self) -> list[LeaseRef]:
        """Every lease this process holds now (slots and waiting-line tickets)."""
        return list(self._held)

    # -- heartbeat -------------------------------------------------------------------------------------------
    async def renew(self) -> list[LeaseRef]:
        """Renew every held lease in one round trip; tell the holders of lost ones. Returns the lost ones.

        When the backend does not answer for a whole TTL, every lease is treated as lost (self-fencing): the
        others have been able to take those slots since.
        """
        held = list(self._held.values())
        if not held:
            self._last_renewed = time.monotonic()
            return []
        sent = time.monotonic()
        # Every held lease is valid on the server until at least (last successful renewal sent) + TTL. A
        # renewal still unanswered at that moment cannot save them: stop waiting and fence their holders now,
        # rather than let them call upstream on slots the server may already have handed to someone else.
        valid_for = self._last_renewed + self.ttl_s - sent
        try:
            if valid_for <= 0:
                raise TimeoutError
            lost_refs = await asyncio.wait_for(
                self.leases.renew([h.ref for h in held], self.ttl_s), valid_for
            )
        except TimeoutError:
            log.warning("quota lease renewal did not answer within the lease TTL: fencing every holder")
            lost_refs = [h.ref for h in held]
        except StoreUnavailable as exc:
            log.warning("quota lease renewal failed: %s", exc)
            if time.monotonic() - self._last_renewed <= self.ttl_s:
                return []
            lost_refs = [h.ref for h in held]
        else:
            self._last_renewed = sent
        lost = set(lost_refs)
        for hold in held:
            if hold.ref in lost and self._held.get(hold.ref) is hold:
                del self._held[hold.ref]
                log.warning("quota lease %s of %s was lost", hold.ref.holder, hold.ref.key)
                hold.on_lost()
        return lost_refs

    # -- wake-ups ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Hand released slots over to the head of their line, and listen for hand-overs announced by other
        processes (runs until cancelled). A lost subscription is re-established with backoff; polling covers
        the gap. Without `run()`, a release only wakes a waiter of the same process."""
        if not self.specs:
            return
        self._handing_over = True
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._announcer(self.channel), name="quota-announcer")
                if self.channel is not None:
                    tg.create_task(self._listen(self.channel), name="quota-listener")
        finally:
            self._handing_over = False

    async def _announcer(self, channel: Channel | None) -> None:
        """After releases of a key, read its line once and tell the waiters at its head — as many as there are
        free slots — to go: they take a slot without reading the line again, and nobody else wakes up."""
        while True:
            _reraise_cancellation()
            await self._announce.wait()
            self._announce.clear()
            keys, self._to_announce = self._to_announce, set()
            for key in keys:
                try:
                    line = sorted(await self.leases.holders(key + WAIT_SUFFIX))
                    if not line:
                        continue
                    free = self.specs[key].limit - len(await self.leases.holders(key))
                    heads = line[: max(1, free)]
                    for ticket in heads:
                        self._go(key, ticket)
                    if channel is not None and any(t not in self._my_tickets for t in heads):
                        await channel.publish(quota_topic(key), ",".join(heads))
                except StoreUnavailable as exc:  # waiters fall back to polling
                    _reraise_cancellation()
                    log.debug("could not hand over a release of %s: %s", key, exc)

    def _go(self, key: str, ticket: str) -> None:
        """Tell the waiter holding `ticket` (if it is ours) that a slot is free for it."""
        fut = self._waiters.get(key, {}).get(ticket)
        if fut is not None and not fut.done():
            fut.set_result(True)
        elif ticket in self._my_tickets:
            self._handed.add(ticket)

    async def _listen(self, channel: Channel) -> None:
        topics = [quota_topic(k) for k in self.specs]
        delay = 0.1
        while True:
            _reraise_cancellation()
            try:
                async for topic, message in channel.subscribe(topics):
                    delay = 0.1
                    key = topic.removeprefix("quota:")
                    for ticket in message.split(","):
                        self._go(key, ticket)
            except StoreUnavailable as exc:
                _reraise_cancellation()
                log.warning("quota wake-up channel lost, polling meanwhile: %s", exc)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 5.0)

    def _wake(self, key: str) -> None:
        """Wake this process's oldest sleeping waiter of `key` (not all of them: one freed slot needs one
        taker, and a herd of waiters re-reading the line would cost a round trip each)."""
        waiters = self._waiters.get(key)
        if waiters:
            for ticket in sorted(waiters):
                fut = waiters[ticket]
                if not fut.done():
                    fut.set_result(False)
                    return
        self._permits[key] = min(self._permits[key] + 1, 64)

    async def _sleep_until_woken(self, key: str, ticket: str, timeout_s: float) -> bool:
        """Sleep until woken or `timeout_s`; True when a hand-over told this ticket to go."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(key, {})
        waiters[ticket] = fut
        try:
            try:
                return await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                return False
        finally:
            waiters.pop(ticket, None)
            if not waiters:
                self._waiters.pop(key, None)

    def _announce_release(self, key: str) -> None:
        if self._handing_over:
            self._to_announce.add(key)
            self._announce.set()
        else:
            self._wake(key)

    # -- acquire / release -----------------------------------------------------------------------------------
    def _track(self, ref: LeaseRef, on_lost: Callable[[], None]) -> None:
        self._held[ref] = _Hold(ref, on_lost)

    def _untrack(self, ref: LeaseRef) -> None:
        self._held.pop(ref, None)

    def _short_circuited(self) -> bool:
        return time.monotonic() < self._down_until

    async def acquire(self, spec: QuotaSpec, holder: str, *, wait: bool, timeout_s: float | None) -> bool:
        """Take a slot of `spec.key` for `holder`. True when a lease is held; False when the backend is down
        and the key is fail-open (the call proceeds unleased). Raises `QuotaExhausted` or
        `QuotaUnavailable`."""
        if self._short_circuited():
            return self._backend_down(spec, None)
        try:
            # FIFO: while others wait in line, a new caller joins the line instead of taking a slot that has
            # just come free for the oldest waiter. (`wait=False` never waits, so it never queues either.)
            if wait and await self.leases.holders(spec.key + WAIT_SUFFIX):
                return await self._wait_in_line(spec, holder, timeout_s)
            if await self._try(spec, holder):
                return True
            if not wait:
                self.rejected[spec.key] += 1
                self.rejections[(spec.key, "full")] += 1
                raise QuotaExhausted(f"every slot of quota {spec.key!r} is held", spec.key, spec.limit)
            return await self._wait_in_line(spec, holder, timeout_s)
        except LeasesUnavailable as exc:
            return self._backend_down(spec, exc)

    async def _try(self, spec: QuotaSpec, holder: str) -> bool:
        return await self.leases.acquire(spec.key, holder, spec.limit, self.ttl_s)

    async def _wait_in_line(self, spec: QuotaSpec, holder: str, timeout_s: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        line_key = spec.key + WAIT_SUFFIX
        ticket = LeaseRef(line_key, new_id())  # time-ordered: the line is sorted by ticket
        self._my_tickets.add(ticket.holder)
        await self.leases.acquire(line_key, ticket.holder, _LINE_LIMIT, self.ttl_s)
        self._track(ticket, lambda: None)  # a lost ticket is taken again below, keeping its place
        go = False
        try:
            while True:
                if go:  # handed a slot: take it without reading the line again
                    go = False
                    if await self._try(spec, holder):
                        return True
                line = sorted(await self.leases.holders(line_key))
                if ticket.holder not in line:
                    await self.leases.acquire(line_key, ticket.holder, _LINE_LIMIT, self.ttl_s)
                    self._track(ticket, lambda: None)
                    line = sorted([*line, ticket.holder])
                ahead = line.index(ticket.holder)
                # The head of the line just tries (acquire is atomic and refuses when full); the others try
                # only if there are enough free slots for everyone ahead of them too.
                if ahead == 0 or ahead < spec.limit - len(await self.leases.holders(spec.key)):
                    if await self._try(spec, holder):
                        return True
                left = self.poll_s if deadline is None else min(self.poll_s, deadline - loop.time())
                if left <= 0:
                    self.rejected[spec.key] += 1
                    self.rejections[(spec.key, "timeout")] += 1
                    raise QuotaExhausted(
                        f"no slot of quota {spec.key!r} came free within {timeout_s:g} s",
                        spec.key,
                        spec.limit,
                    )
                if ticket.holder in self._handed:
                    self._handed.discard(ticket.holder)
                    go = True
                    continue  # handed a slot while we were checking
                if self._permits[spec.key] > 0:
                    self._permits[spec.key] -= 1
                    continue  # a release was announced while we were checking: check again now
                # Jitter the polling floor so that waiters of many processes do not poll in lockstep.
                go = await self._sleep_until_woken(spec.key, ticket.holder, left * random.uniform(0.8, 1.0))
        finally:
            # No wake-up for the next in line: leaving the line frees no slot, and every release that did free
            # one has woken (or left a permit for) a waiter of its own.
            self._untrack(ticket)
            self._my_tickets.discard(ticket.holder)
            self._handed.discard(ticket.holder)
            with contextlib.suppress(StoreUnavailable):
                await self.leases.release(line_key, ticket.holder)

    def _backend_down(self, spec: QuotaSpec, exc: LeasesUnavailable | None) -> bool:
        if exc is not None:
            self._down_until = time.monotonic() + self.breaker_s
            log.warning("quota backend down, short-circuiting for %.1f s: %s", self.breaker_s, exc)
        if spec.fail_open:
            self.fail_open_admitted[spec.key] += 1
            return False
        self.rejected[spec.key] += 1
        self.rejections[(spec.key, "unavailable")] += 1
        raise QuotaUnavailable(
            f"quota {spec.key!r} is fail-closed and its lease backend is unavailable", spec.key
        ) from exc

    async def release(self, ref: LeaseRef) -> None:
        """Give a slot back (harmless twice) and wake the oldest waiter. Never raises: a release that cannot
        reach the backend leaves a lease that expires within one TTL."""
        self._untrack(ref)
        try:
            await self.leases.release(ref.key, ref.holder)
        except StoreUnavailable as exc:
            log.warning("quota release of %s failed (it expires within the TTL): %s", ref.key, exc)
            return
        self._announce_release(ref.key)


class QuotaBlock:
    """One `async with ctx.quota(key)`: a held slot for the duration of the block.

    A block that ends normally gives its slot back at once; one that ends with an exception or a cancellation
    leaves its lease to expire within one TTL (see `_abandon`). If the lease is lost while the block runs,
    the task running the block is cancelled and the block raises `LeaseLost` instead of `CancelledError`
    (the way `asyncio.timeout` turns its cancellation into `TimeoutError`).
    """

    def __init__(
        self, owner: ExecutionQuotas, spec: QuotaSpec, *, wait: bool, timeout_s: float | None
    ) -> None:
        self._owner = owner
        self.spec = spec
        self._wait = wait
        self._timeout_s = timeout_s
        self.ref: LeaseRef | None = None
        self.leased = False
        self.lost = False
        self.paused = False
        self._task: asyncio.Task[object] | None = None
        self._cancel_pending = False

    async def __aenter__(self) -> QuotaBlock:
        self._task = asyncio.current_task()
        self.ref = LeaseRef(self.spec.key, self._owner.next_holder())
        await self._take(wait=self._wait, timeout_s=self._timeout_s)
        self._owner.blocks.append(self)
        return self

    async def _take(self, *, wait: bool, timeout_s: float | None) -> None:
        assert self.ref is not None
        manager = self._owner.manager
        self.leased = await manager.acquire(self.spec, self.ref.holder, wait=wait, timeout_s=timeout_s)
        if self.leased:
            manager._track(self.ref, self._on_lost)

    def _on_lost(self) -> None:
        if self.lost or self.paused:
            return
        self.lost = True
        if self._task is not None and not self._task.done():
            self._cancel_pending = True
            assert self.ref is not None
            self._task.cancel(f"LeaseLost: {self.ref.key} {self.ref.holder}")

    async def pause(self) -> None:
        """Give the slot back while the execution waits (for a human, for input)."""
        if self.leased and not self.paused and self.ref is not None:
            self.paused = True
            self.leased = False
            await self._owner.manager.release(self.ref)

    async def resume(self) -> None:
        """Take a slot again before the execution continues (waits in line like any other acquirer)."""
        if self.paused:
            await self._take(wait=True, timeout_s=None)
            self.paused = False

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        with contextlib.suppress(ValueError):
            self._owner.blocks.remove(self)
        if self._cancel_pending and self._task is not None:
            self._cancel_pending = False
            if exc_type is None or not issubclass(exc_type, asyncio.CancelledError):
                # Our cancellation has not been delivered yet: take it here, so it does not hit a later await.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            if self._task.uncancel() > 0:
                self._abandon()
                return False  # someone else cancelled the task too: let that cancellation through
        if exc_type is None or self.lost:
            await self._give_back()
        else:
            self._abandon()
        if self.lost:
            assert self.ref is not None
            cause = None if exc_type is None or issubclass(exc_type, asyncio.CancelledError) else exc
            raise LeaseLost(
                f"the lease on quota {self.ref.key!r} was lost while in use", self.ref.key, self.ref.holder
            ) from cause
        return False

    def _abandon(self) -> None:
        """The block ended abnormally (an exception, a cancellation): the upstream call it guarded may still
        be running on the other side — a closed connection is noticed by the server only later. Giving the
        slot back now could let the next holder in before the server has counted this call out, and the
        server would answer 429. So the lease is only no longer renewed: it expires within one TTL."""
        if self.ref is not None and self.leased:
            self.leased = False
            self._owner.manager._untrack(self.ref)

    async def _give_back(self) -> None:
        if self.ref is None:
            return
        if self.leased or self.lost:
            self.leased = False
            await self._owner.manager.release(self.ref)


class ExecutionQuotas:
    """The quota blocks of one execution, and the pause / resume hooks of `ctx.approval()` and
    `ctx.next_input()` (which release every lease while waiting and take them back before continuing)."""

    def __init__(self, manager: QuotaManager, execution_id: str) -> None:
        self.manager = manager
        self.execution_id = execution_id
        self.blocks: list[QuotaBlock] = []
        self._slots = itertools.count()

    def next_holder(self) -> str:
        """A holder id no other block of this execution uses: `<execution id>:<slot>`."""
        return f"{self.execution_id}:{next(self._slots)}"

    def quota(self, key: str, *, wait: bool = True, timeout_s: float | None = None) -> QuotaBlock:
        """`async with quotas.quota(key):` holds one slot of `key` for the block."""
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        return QuotaBlock(self, self.manager.spec(key), wait=wait, timeout_s=timeout_s)

    async def pause(self) -> None:
        """Release every lease this execution holds (it keeps its blocks open)."""
        for block in list(self.blocks):
            await block.pause()

    async def resume(self) -> None:
        """Take back a slot for every paused block, oldest block first."""
        for block in list(self.blocks):
            await block.resume()

    async def release_all(self) -> None:
        """The execution ended: release whatever its blocks still hold (a safety net: blocks release on
        exit)."""
        for block in list(self.blocks):
            await block._give_back()
        self.blocks.clear()
