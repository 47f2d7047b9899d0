"""Global quotas as named leases: `async with ctx.quota("llm:gpt-4o"):` in a handler.

    QuotaManager        one per worker process: the configured limits, every lease the process holds, one
                        renewal round trip per heartbeat, the fail-closed short circuit, the wake-ups
    ExecutionQuotas     one per execution: hands out holder ids `<execution id>:<slot>`, pauses and resumes
    QuotaBlock          one `async with`: acquire on enter, release on exit, LeaseLost if the lease was lost

Fairness (`wait=True`): a caller takes a slot through the key's waiting line (`Leases.acquire_in_line`): it
gets one at once only if fewer older tickets wait than there are free slots, else its ticket — a lease on
`<key>#wait`, renewed with the others, so a waiter that dies leaves the line on its own — waits in line. A
release is `Leases.release_and_hand_over`: in the same atomic step on the server, the freed slot is given to
the oldest ticket's holder, so a slot is never idle while someone waits and the oldest waiter across all
workers gets it. The releaser then tells that waiter it already holds the slot: at once when it is in the same
process, over the `Channel` (topic `quota:<key>`, a comma-separated list of tickets) otherwise. The waiter takes
no further round trip. Polling (`acquire_in_line` again every `poll_s`) is the floor when no channel is
configured or a message is lost. A slot that came free by expiry (a dead holder's: nobody released it) is served
by the first poll of any waiter: one that finds slots free for older tickets hands them over as a release does.

Fencing: when a renewal reports a lease lost, the task inside the holding block is cancelled and the block
raises `LeaseLost`: the slot may already belong to someone else, so no upstream call continues on it. Every lease
also carries the moment until which this process knows it valid (the send time of the call that granted or last
renewed it, plus the TTL); a loop timer fences it then if no renewal came first. A process that was frozen
(SIGSTOP, a VM pause) or starved past that moment runs that timer before any task it resumes, so no block goes on
to call upstream on a lease that expired meanwhile; and a slot whose grant is read only after such a stall is
confirmed by one renewal before its block runs (an expired lease is never renewed).

Failure policy per key: `fail-closed` (default) raises `QuotaUnavailable` and short-circuits the backend
for `breaker_s` seconds; `fail-open` lets the call through without a lease and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence

from tenure.contracts.channel import Channel
from tenure.contracts.errors import (
    ConfigError,
    LeasesUnavailable,
    QuotaExhausted,
    QuotaUnavailable,
    StoreUnavailable,
)
from tenure.contracts.leases import InLine
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.store import WAIT_SUFFIX, LeaseRef, Leases, line_key, new_ticket, ticket_holder

log = logging.getLogger("tenure.quotas")


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
    """One lease this process holds (a slot, or a ticket in a waiting line), whom to tell if it is lost, and until
    when (`time.monotonic()`) it is known valid on the server."""

    __slots__ = ("on_lost", "ref", "valid_until")

    def __init__(self, ref: LeaseRef, on_lost: Callable[[], None], valid_until: float) -> None:
        self.ref = ref
        self.on_lost = on_lost
        self.valid_until = valid_until


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
        leases_announce: bool = False,
    ) -> None:
        """`leases_announce`: the lease backend publishes the tickets a release served on the channel itself
        (`RedisLeases(announce_prefix=<channel prefix> + quota_topic(""))`), so this manager does not."""
        if not ttl_s > 0:
            raise ConfigError(f"quota lease TTL must be positive, not {ttl_s}")
        self.leases = leases
        self.specs = dict(specs)
        self.ttl_s = ttl_s
        self.channel = channel
        self.poll_s = poll_s
        self.breaker_s = breaker_s
        self.leases_announce = leases_announce
        self._held: dict[LeaseRef, _Hold] = {}
        # Tickets of this process's waiters → the future a hand-over resolves (the slot is then already held).
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._handing_over = False  # run() is active: hand-overs to other processes are announced by it
        # Hand-overs to announce on the channel, published by `run()` so that a release never waits for it.
        self._to_announce: deque[tuple[str, list[str]]] = deque()
        self._announce = asyncio.Event()
        self._down_until = 0.0
        self._last_renewed = time.monotonic()
        self._fence: asyncio.TimerHandle | None = None  # fires when the soonest held lease's validity runs out
        self._fence_at = 0.0
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
            raise ConfigError(f"quota {key!r} is not configured (TENURE_QUOTAS / tenure.toml; known: {known})")
        return spec

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
            lost_refs = await asyncio.wait_for(self.leases.renew([h.ref for h in held], self.ttl_s), valid_for)
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
                if not hold.ref.key.endswith(WAIT_SUFFIX):
                    # (A ticket leaves the line when it is served, often before its waiter has heard of it.)
                    log.warning("quota lease %s of %s was lost", hold.ref.holder, hold.ref.key)
                hold.on_lost()
            elif hold.ref not in lost:
                hold.valid_until = max(hold.valid_until, sent + self.ttl_s)
        self._arm_fence()
        return lost_refs

    def _arm_fence(self) -> None:
        """Have the loop fence the soonest-lapsing lease when its validity runs out, unless renewed by then."""
        if not self._held:
            return
        soonest = min(h.valid_until for h in self._held.values())
        if self._fence is not None:
            if self._fence_at <= soonest:
                return  # fires first; it re-arms for whatever is still held then
            self._fence.cancel()
        self._fence_at = soonest
        self._fence = asyncio.get_running_loop().call_later(max(0.0, soonest - time.monotonic()), self._fence_lapsed)

    def _fence_lapsed(self) -> None:
        # A loop callback, not a task: after a freeze or a stall the loop runs it before the steps of the tasks it
        # resumes (those are scheduled by this same loop iteration, so they run in the next one), and the
        # cancellation of a holding block lands before its task can send anything upstream.
        self._fence = None
        now = time.monotonic()
        for hold in [h for h in self._held.values() if h.valid_until <= now]:
            del self._held[hold.ref]
            if not hold.ref.key.endswith(WAIT_SUFFIX):
                log.warning(
                    "quota lease %s of %s lapsed %.2f s ago without a renewal (the process was frozen or starved): "
                    "fencing its holder",
                    hold.ref.holder,
                    hold.ref.key,
                    now - hold.valid_until,
                )
            hold.on_lost()
        self._arm_fence()

    # -- wake-ups ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Announce hand-overs to waiters of other processes, and listen for theirs (runs until cancelled). A
        lost subscription is re-established with backoff; polling covers the gap. Without `run()`, a release
        tells only the waiters of the same process; the others find their slot by polling."""
        if not self.specs or self.channel is None:
            return
        self._handing_over = True
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._announcer(self.channel), name="quota-announcer")
                tg.create_task(self._listen(self.channel), name="quota-listener")
        finally:
            self._handing_over = False

    async def _announcer(self, channel: Channel) -> None:
        """Publish the tickets served by releases of this process (and not waiting here) on their key's topic."""
        while True:
            _reraise_cancellation()
            await self._announce.wait()
            self._announce.clear()
            while self._to_announce:
                key, tickets = self._to_announce.popleft()
                try:
                    await channel.publish(quota_topic(key), ",".join(tickets))
                except StoreUnavailable as exc:  # those waiters fall back to polling
                    _reraise_cancellation()
                    log.debug("could not announce a hand-over of %s: %s", key, exc)

    async def _listen(self, channel: Channel) -> None:
        topics = [quota_topic(k) for k in self.specs]
        delay = 0.1
        while True:
            _reraise_cancellation()
            try:
                async for _topic, message in channel.subscribe(topics):
                    delay = 0.1
                    for ticket in message.split(","):
                        self._granted(ticket)
            except StoreUnavailable as exc:
                _reraise_cancellation()
                log.warning("quota wake-up channel lost, polling meanwhile: %s", exc)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 5.0)

    def _granted(self, ticket: str) -> bool:
        """Tell this process's waiter holding `ticket` (if any) that it holds a slot now. True if it was ours."""
        fut = self._waiters.get(ticket)
        if fut is None:
            return False
        if not fut.done():
            fut.set_result(None)
        return True

    def _served(self, key: str, tickets: Sequence[str]) -> None:
        """A release (or a poll of the line) handed slots of `key` to `tickets`: wake ours now, announce the others'."""
        others = [t for t in tickets if not self._granted(t)]
        if others and self._handing_over and not self.leases_announce:
            self._to_announce.append((key, others))
            self._announce.set()

    # -- acquire / release -----------------------------------------------------------------------------------
    def _track(self, ref: LeaseRef, on_lost: Callable[[], None], valid_until: float | None = None) -> _Hold:
        """Hold `ref` (renewed by the heartbeat; `on_lost()` when it is lost). `valid_until`: until when it is known
        valid on the server (default: what the last renewal vouches for)."""
        hold = _Hold(ref, on_lost, self._last_renewed + self.ttl_s if valid_until is None else valid_until)
        self._held[ref] = hold
        self._arm_fence()
        return hold

    def _untrack(self, ref: LeaseRef) -> None:
        self._held.pop(ref, None)

    def _short_circuited(self) -> bool:
        return time.monotonic() < self._down_until

    async def acquire(self, spec: QuotaSpec, holder: str, *, wait: bool, timeout_s: float | None) -> bool:
        """Take a slot of `spec.key` for `holder`. True when a lease is held; False when the backend is down
        and the key is fail-open (the call proceeds unleased). Raises `QuotaExhausted` or
        `QuotaUnavailable`."""
        return await self.acquire_until(spec, holder, wait=wait, timeout_s=timeout_s) is not None

    async def acquire_until(self, spec: QuotaSpec, holder: str, *, wait: bool, timeout_s: float | None) -> float | None:
        """`acquire`, answering until when (`time.monotonic()`) the lease is known valid, or None when the call
        proceeds unleased (fail-open)."""
        if self._short_circuited():
            self._backend_down(spec, None)
            return None
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            while True:
                if not wait:  # never waits, so never queues either
                    sent = time.monotonic()
                    if not await self.leases.acquire(spec.key, holder, spec.limit, self.ttl_s):
                        self.rejected[spec.key] += 1
                        self.rejections[(spec.key, "full")] += 1
                        raise QuotaExhausted(f"every slot of quota {spec.key!r} is held", spec.key, spec.limit)
                    valid_until = sent + self.ttl_s
                else:
                    left = None if deadline is None else max(0.0, deadline - loop.time())
                    valid_until = await self._acquire_in_line(spec, holder, left, timeout_s)
                confirmed = await self._confirm(spec.key, holder, valid_until)
                if confirmed is not None:
                    return confirmed
                # Expired while this process could not run: its slot may be someone else's now. Ask again.
        except LeasesUnavailable as exc:
            self._backend_down(spec, exc)
            return None

    async def _confirm(self, key: str, holder: str, valid_until: float) -> float | None:
        """A lease with most of its TTL left is taken as granted. One whose grant was read late — the process was
        frozen or starved in between — may have expired on the server, its slot taken by someone else: one renewal
        tells (an expired lease is never renewed). Returns until when it is valid, or None if it is gone."""
        if valid_until - time.monotonic() >= self.ttl_s / 2:
            return valid_until
        sent = time.monotonic()
        if await self.leases.renew([LeaseRef(key, holder)], self.ttl_s):
            log.warning(
                "quota lease %s of %s expired before its grant was read (frozen or starved): asking again", holder, key
            )
            return None
        return sent + self.ttl_s

    async def _acquire_in_line(self, spec: QuotaSpec, holder: str, left_s: float | None, timeout_s: float | None) -> float:
        """Take a slot in line; until when it is known valid."""
        loop = asyncio.get_running_loop()
        deadline = None if left_s is None else loop.time() + left_s
        ticket = LeaseRef(line_key(spec.key), new_ticket(holder))
        # Listen before asking: a hand-over may be announced before the answer to our own call arrives.
        granted: asyncio.Future[None] = loop.create_future()
        self._waiters[ticket.holder] = granted
        queued = held = False
        try:
            sent = time.monotonic()
            if self._in_line(spec, await self.leases.acquire_in_line(spec.key, ticket.holder, spec.limit, self.ttl_s)):
                held = True
                return sent + self.ttl_s
            queued = True
            # A lost ticket is queued again by the next poll, keeping its place. A slot handed to it lasts as long as
            # the ticket would have: until its last refresh (a poll, or a renewal) plus the TTL.
            line = self._track(ticket, lambda: None, sent + self.ttl_s)
            while True:
                left = self.poll_s if deadline is None else min(self.poll_s, deadline - loop.time())
                if left > 0:
                    # Jitter the polling floor so that waiters of many processes do not poll in lockstep.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(granted), left * random.uniform(0.8, 1.0))
                if granted.done():
                    held = True
                    return line.valid_until  # a release handed us the slot on the server: nothing left to ask
                if deadline is not None and loop.time() >= deadline:
                    self.rejected[spec.key] += 1
                    self.rejections[(spec.key, "timeout")] += 1
                    raise QuotaExhausted(
                        f"no slot of quota {spec.key!r} came free within {timeout_s:g} s", spec.key, spec.limit
                    )
                # The floor: were we handed a slot whose message was lost, or did one come free by expiry?
                sent = time.monotonic()
                if self._in_line(spec, await self.leases.acquire_in_line(spec.key, ticket.holder, spec.limit, self.ttl_s)):
                    held = True
                    return sent + self.ttl_s
                line.valid_until = max(line.valid_until, sent + self.ttl_s)
        finally:
            self._waiters.pop(ticket.holder, None)
            self._untrack(ticket)
            if queued and not held:
                # Timed out, cancelled, or the backend failed: a dead ticket must not stay at the head of the
                # line (slots handed to it would idle until it expires), nor a slot granted meanwhile.
                await self._leave_line(spec, ticket)

    def _in_line(self, spec: QuotaSpec, answer: InLine) -> bool:
        """Whether a poll of the line took a slot; the older waiters it served (slots that came free by expiry,
        which no release hands over) are told like those of a release."""
        if answer.served:
            self._served(spec.key, answer.served)
        return answer.held

    async def _leave_line(self, spec: QuotaSpec, ticket: LeaseRef) -> None:
        """Give up waiting: leave the line, and give back (handing it over) a slot granted meanwhile."""
        with contextlib.suppress(StoreUnavailable):
            await self.leases.release(ticket.key, ticket.holder)
            served = await self.leases.release_and_hand_over(spec.key, ticket_holder(ticket.holder), spec.limit, self.ttl_s)
            self._served(spec.key, served)

    def _backend_down(self, spec: QuotaSpec, exc: LeasesUnavailable | None) -> bool:
        if exc is not None:
            self._down_until = time.monotonic() + self.breaker_s
            log.warning("quota backend down, short-circuiting for %.1f s: %s", self.breaker_s, exc)
        if spec.fail_open:
            self.fail_open_admitted[spec.key] += 1
            return False
        self.rejected[spec.key] += 1
        self.rejections[(spec.key, "unavailable")] += 1
        raise QuotaUnavailable(f"quota {spec.key!r} is fail-closed and its lease backend is unavailable", spec.key) from exc

    async def release(self, ref: LeaseRef) -> None:
        """Give a slot back (harmless twice), handing it to the oldest waiter in the same step, and tell that
        waiter. Never raises: a release that cannot reach the backend leaves a lease that expires within one
        TTL."""
        self._untrack(ref)
        spec = self.specs.get(ref.key)
        try:
            if spec is None:
                await self.leases.release(ref.key, ref.holder)
                return
            served = await self.leases.release_and_hand_over(ref.key, ref.holder, spec.limit, self.ttl_s)
        except StoreUnavailable as exc:
            log.warning("quota release of %s failed (it expires within the TTL): %s", ref.key, exc)
            return
        if served:
            self._served(ref.key, served)
