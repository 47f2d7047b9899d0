"""The quota layer (`control/quotas.py`) on real lease backends: waiting in line, timeouts, fencing a lost
lease, the failure policies, pause / resume. Several `QuotaManager`s on one backend stand for several worker
processes (each has its own connections)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.driver_info import DriverInfo

from tenure.backends.redis import RedisChannel, RedisLeases
from tenure.contracts.errors import LeaseLost, QuotaExhausted, QuotaUnavailable
from tenure.contracts.leases import InLine
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.store import LeaseRef, Leases
from tenure.control.quota_blocks import ExecutionQuotas
from tenure.control.quotas import QuotaManager, quota_topic
from tests.contract.test_leases import BACKENDS, REDIS_URL, establish_lease_state

TTL = 5.0


@pytest.fixture(params=sorted(BACKENDS))
async def open_leases(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Callable[[], Awaitable[Leases]]]:
    """Open lease backends on one namespace (the first one owns and drops it)."""
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        opened = 0

        async def open_one() -> Leases:
            nonlocal opened
            opened += 1
            return await stack.enter_async_context(BACKENDS[request.param](namespace, drop=opened == 1))

        yield open_one


@pytest.fixture
def namespace() -> str:
    import uuid

    return uuid.uuid4().hex


def manager(leases: Leases, limit: int = 1, **kw: object) -> QuotaManager:
    specs = {"llm:m": QuotaSpec("llm:m", limit)}
    return QuotaManager(leases, specs, ttl_s=TTL, poll_s=0.05, **kw)  # type: ignore[arg-type]


async def test_wait_false_is_refused_at_once_when_every_slot_is_held(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    q = manager(await open_leases(), limit=2)
    a, b, c = (ExecutionQuotas(q, x) for x in "abc")
    async with a.quota("llm:m"), b.quota("llm:m", wait=False):
        with pytest.raises(QuotaExhausted) as refused:
            async with c.quota("llm:m", wait=False):
                pytest.fail("a third holder got in")
        assert refused.value.key == "llm:m" and refused.value.limit == 2
        assert len(await q.leases.holders("llm:m")) == 2
    assert await q.leases.holders("llm:m") == []
    async with c.quota("llm:m", wait=False):
        assert await q.leases.holders("llm:m") == ["c:1"]  # a new slot index per block


async def test_a_wait_that_times_out_raises_quota_exhausted_and_leaves_the_line(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    q = manager(await open_leases())
    async with ExecutionQuotas(q, "a").quota("llm:m"):
        with pytest.raises(QuotaExhausted):
            async with ExecutionQuotas(q, "b").quota("llm:m", timeout_s=0.2):
                pytest.fail("got a held slot")
        assert await q.leases.holders("llm:m#wait") == []


async def test_released_slots_go_to_waiters_oldest_first_across_processes(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    managers = [manager(await open_leases()) for _ in range(3)]
    order: list[str] = []
    holding = ExecutionQuotas(managers[0], "first").quota("llm:m")
    await holding.__aenter__()

    async def wait_then_record(name: str, q: QuotaManager) -> None:
        async with ExecutionQuotas(q, name).quota("llm:m", timeout_s=30):
            order.append(name)
            await asyncio.sleep(0.01)

    names = [f"w{i}" for i in range(6)]
    async with asyncio.TaskGroup() as tg:
        for i, name in enumerate(names):
            tg.create_task(wait_then_record(name, managers[i % 3]))

            # Each waiter has taken its ticket before the next arrives.
            async def in_line(n: int = i + 1) -> bool:
                return len(await managers[0].leases.holders("llm:m#wait")) == n

            while not await in_line():
                await asyncio.sleep(0.005)
        await holding.__aexit__(None, None, None)
    assert order == names


async def test_a_lease_lost_at_renewal_cancels_the_holding_block_with_lease_lost(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    leases = await open_leases()
    q = manager(leases)
    reached_after_loss = False
    with pytest.raises(LeaseLost) as caught:
        async with ExecutionQuotas(q, "x").quota("llm:m"):
            await leases.release("llm:m", "x:0")  # e.g. expired and purged while the process was frozen
            assert await q.renew() == [LeaseRef("llm:m", "x:0")]
            await asyncio.sleep(5)  # the upstream call: must not continue
            reached_after_loss = True
    assert not reached_after_loss
    assert caught.value.key == "llm:m" and caught.value.holder == "x:0"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert q.held == []


async def test_the_heartbeat_renewal_keeps_every_held_lease_in_one_call(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    leases = await open_leases()
    calls: list[int] = []

    class Counting:
        """Counts renew round trips; delegates everything to the real backend."""

        async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
            return await leases.acquire(key, holder, limit, ttl_s)

        async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
            calls.append(len(held))
            return await leases.renew(held, ttl_s)

        async def release(self, key: str, holder: str) -> None:
            await leases.release(key, holder)

        async def holders(self, key: str) -> list[str]:
            return await leases.holders(key)

        async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
            return await leases.acquire_in_line(key, ticket, limit, ttl_s)

        async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
            return await leases.release_and_hand_over(key, holder, limit, ttl_s)

    q = manager(Counting(), limit=5)  # type: ignore[arg-type]
    a, b = ExecutionQuotas(q, "a"), ExecutionQuotas(q, "b")
    async with a.quota("llm:m"), a.quota("llm:m"), b.quota("llm:m"):
        assert await q.renew() == []
        assert calls == [3]
        assert sorted(await leases.holders("llm:m")) == ["a:0", "a:1", "b:0"]


async def test_pause_gives_every_slot_back_and_resume_takes_them_again(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    q = manager(await open_leases())
    approver = ExecutionQuotas(q, "approver")
    async with approver.quota("llm:m"):
        await approver.pause()  # what ctx.approval() / ctx.next_input() do while waiting
        assert await q.leases.holders("llm:m") == []
        async with ExecutionQuotas(q, "other").quota("llm:m", wait=False):
            resumed = asyncio.create_task(approver.resume())
            await asyncio.sleep(0.1)
            assert not resumed.done(), "resume must wait for a free slot"
        await resumed
        assert await q.leases.holders("llm:m") == ["approver:0"]
        assert await q.renew() == []
    assert await q.leases.holders("llm:m") == []


# -- failure policies (a Redis that does not answer) ------------------------------------------------------
class CountingDead:
    """A RedisLeases on a port nobody listens on, counting the calls that reach it."""

    def __init__(self) -> None:
        self.inner = RedisLeases("redis://127.0.0.1:1/0", timeout_s=0.5)
        self.calls = 0

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        self.calls += 1
        return await self.inner.acquire(key, holder, limit, ttl_s)

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        self.calls += 1
        return await self.inner.renew(held, ttl_s)

    async def release(self, key: str, holder: str) -> None:
        self.calls += 1
        await self.inner.release(key, holder)

    async def holders(self, key: str) -> list[str]:
        self.calls += 1
        return await self.inner.holders(key)

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
        self.calls += 1
        return await self.inner.acquire_in_line(key, ticket, limit, ttl_s)

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        self.calls += 1
        return await self.inner.release_and_hand_over(key, holder, limit, ttl_s)


async def test_fail_closed_raises_quota_unavailable_and_short_circuits_the_dead_backend() -> None:
    dead = CountingDead()
    try:
        q = QuotaManager(dead, {"k": QuotaSpec("k", 3)}, ttl_s=TTL, breaker_s=30)  # type: ignore[arg-type]
        with pytest.raises(QuotaUnavailable):
            async with ExecutionQuotas(q, "a").quota("k"):
                pytest.fail("ran without a lease on a fail-closed key")
        calls = dead.calls
        for name in "bcd":
            with pytest.raises(QuotaUnavailable):
                async with ExecutionQuotas(q, name).quota("k", wait=False):
                    pytest.fail("ran without a lease on a fail-closed key")
        assert dead.calls == calls, "the short circuit should keep callers off the dead backend"
        assert q.rejected["k"] == 4
    finally:
        await dead.inner.close()


async def test_fail_open_lets_the_call_through_unleased_and_counts_it() -> None:
    dead = CountingDead()
    try:
        spec = QuotaSpec("k", 1, "fail-open")
        q = QuotaManager(dead, {"k": spec}, ttl_s=TTL, breaker_s=30)  # type: ignore[arg-type]
        ran = 0
        for name in "abc":
            async with ExecutionQuotas(q, name).quota("k"):
                ran += 1
        assert ran == 3
        assert q.fail_open_admitted["k"] == 3
        assert q.held == []
    finally:
        await dead.inner.close()


async def a_release_wakes_the_waiter_in_the_other_process(
    qs: list[QuotaManager], leases: Sequence[Leases], subscribed: Callable[[], Awaitable[None]]
) -> None:
    """Two managers (two processes) share quota "k" of 1. The first holds it; once both listen (`subscribed`) the
    second waits for it, and gets it when the first releases — by the hand-over's message, not by polling. Each
    manager's run() announces its releases."""
    async with asyncio.TaskGroup() as tg:
        listeners = [tg.create_task(q.run()) for q in qs]
        holder = ExecutionQuotas(qs[0], "a").quota("k")
        await holder.__aenter__()
        await subscribed()
        waiter = tg.create_task(ExecutionQuotas(qs[1], "b").quota("k").__aenter__())
        while not await leases[0].holders("k#wait"):
            await asyncio.sleep(0.005)
        await holder.__aexit__(None, None, None)
        async with asyncio.timeout(5):  # far below the 30 s polling floor
            block = await waiter
        await block.__aexit__(None, None, None)
        for listener in listeners:
            listener.cancel()


async def a_slot_freed_by_expiry_reaches_the_oldest_waiter_by_a_younger_ones_poll(
    qs: list[QuotaManager], leases: Sequence[Leases], subscribed: Callable[[], Awaitable[None]]
) -> None:
    """Quota "k" of 1 is held by a holder no manager knows (a dead worker's). The first manager's waiter queues
    first, the second's after it; the slot then comes free with no release to hand it over (as an expiry does).
    The second waiter's poll finds it free for the older ticket and serves it; its manager announces it, and the
    first waiter — whose own polls are 30 s apart — gets it by that message (issue: migration 0017)."""
    qs[1].poll_s = 0.05
    assert await leases[0].acquire("k", "dead", 1, TTL)
    async with asyncio.TaskGroup() as tg:
        listeners = [tg.create_task(q.run()) for q in qs]
        await subscribed()
        oldest = tg.create_task(ExecutionQuotas(qs[0], "a").quota("k").__aenter__())
        while len(await leases[0].holders("k#wait")) < 1:
            await asyncio.sleep(0.005)
        younger = tg.create_task(ExecutionQuotas(qs[1], "b").quota("k").__aenter__())
        while len(await leases[0].holders("k#wait")) < 2:
            await asyncio.sleep(0.005)
        await leases[0].release("k", "dead")  # no hand-over
        async with asyncio.timeout(5):  # far below the oldest waiter's 30 s polling floor
            block = await oldest
        assert await leases[0].holders("k") == ["a:0"]
        assert not younger.done(), "the younger waiter overtook the oldest"
        await block.__aexit__(None, None, None)  # hands the slot to the younger waiter
        async with asyncio.timeout(5):
            await (await younger).__aexit__(None, None, None)
        for listener in listeners:
            listener.cancel()


FREED_BY = {
    "release": a_release_wakes_the_waiter_in_the_other_process,
    "expiry": a_slot_freed_by_expiry_reaches_the_oldest_waiter_by_a_younger_ones_poll,
}


@pytest.mark.parametrize("freed_by", sorted(FREED_BY))
@pytest.mark.parametrize("announced_by", ["manager", "lease script"])
async def test_waiters_in_other_processes_are_woken_by_a_message_not_by_polling(
    namespace: str, announced_by: str, freed_by: str
) -> None:
    prefix = f"tenure-test:{namespace}:lease:"
    chan = f"tenure-test:{namespace}:chan:"
    in_script = announced_by == "lease script"
    announce_prefix = chan + quota_topic("") if in_script else None
    await establish_lease_state(REDIS_URL, prefix)
    leases = [RedisLeases(REDIS_URL, prefix=prefix, announce_prefix=announce_prefix) for _ in range(2)]
    channels = [RedisChannel(REDIS_URL, prefix=chan) for _ in range(2)]
    specs = {"k": QuotaSpec("k", 1)}
    qs = [
        QuotaManager(lease, specs, ttl_s=TTL, channel=c, poll_s=30.0, leases_announce=in_script)
        for lease, c in zip(leases, channels, strict=True)
    ]

    async def subscribed() -> None:
        raw = redis.asyncio.Redis.from_url(REDIS_URL, driver_info=DriverInfo(lib_version=redis.__version__))
        try:
            topic = f"tenure-test:{namespace}:chan:quota:k"
            while (await raw.pubsub_numsub(topic))[0][1] < 2:  # both listeners have subscribed
                await asyncio.sleep(0.01)
        finally:
            await raw.aclose()

    try:
        await FREED_BY[freed_by](qs, leases, subscribed)
    finally:
        for x in (*leases, *channels):
            await x.close()


async def test_a_renewal_that_hangs_past_the_ttl_fences_the_holders_without_waiting_for_it(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    leases = await open_leases()

    class Hanging:
        """The real backend, except that renewals never answer (a stalled network path)."""

        async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
            return await leases.acquire(key, holder, limit, ttl_s)

        async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
            await asyncio.sleep(3600)
            return []

        async def release(self, key: str, holder: str) -> None:
            await leases.release(key, holder)

        async def holders(self, key: str) -> list[str]:
            return await leases.holders(key)

        async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
            return await leases.acquire_in_line(key, ticket, limit, ttl_s)

        async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
            return await leases.release_and_hand_over(key, holder, limit, ttl_s)

    q = QuotaManager(Hanging(), {"k": QuotaSpec("k", 1)}, ttl_s=0.5)  # type: ignore[arg-type]
    with pytest.raises(LeaseLost):
        async with ExecutionQuotas(q, "x").quota("k"):
            async with asyncio.timeout(5):  # the renewal gives up at the TTL, long before this
                await q.renew()
            await asyncio.sleep(5)


async def test_a_block_that_ends_with_an_error_leaves_its_lease_to_expire_instead_of_releasing_it(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    # The upstream may not have noticed the aborted call yet: handing the slot over at once would overrun it.
    leases = await open_leases()
    q = QuotaManager(leases, {"k": QuotaSpec("k", 1)}, ttl_s=0.5, poll_s=0.05)
    with pytest.raises(RuntimeError):
        async with ExecutionQuotas(q, "a").quota("k"):
            raise RuntimeError("the stream broke")
    assert q.held == [], "an abandoned lease is no longer renewed"
    assert await leases.holders("k") == ["a:0"]
    with pytest.raises(QuotaExhausted):
        async with ExecutionQuotas(q, "b").quota("k", wait=False):
            pass
    async with ExecutionQuotas(q, "c").quota("k", timeout_s=5):  # comes free once the TTL has passed
        assert await leases.holders("k") == ["c:0"]


@pytest.mark.parametrize("freed_by", sorted(FREED_BY))
async def test_without_redis_waiters_in_other_processes_are_woken_by_a_notify_not_by_polling(
    pg_database_url: str, namespace: str, freed_by: str
) -> None:
    """Leases in PostgreSQL: the release's hand-over is announced with a NOTIFY (PostgresChannel)."""
    import asyncpg

    from tenure.app import open_backends
    from tenure.backends.postgres import PostgresChannel, PostgresLeases
    from tenure.settings import Settings
    from tests.conftest import PG_BASE

    await (await open_backends(Settings.of(database_url=pg_database_url))).close()  # migrated
    leases = [await PostgresLeases.connect(pg_database_url) for _ in range(2)]
    prefix = f"t{namespace[:8]}:"
    channels = [PostgresChannel(pg_database_url, prefix=prefix) for _ in range(2)]
    specs = {"k": QuotaSpec("k", 1)}
    qs = [QuotaManager(lease, specs, ttl_s=TTL, channel=c, poll_s=30.0) for lease, c in zip(leases, channels, strict=True)]
    admin = await asyncpg.connect(PG_BASE)

    async def subscribed() -> None:
        listen = f'LISTEN "{channels[0].name(quota_topic("k"))}"'
        while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE query = $1", listen) < 2:
            await asyncio.sleep(0.01)

    try:
        await FREED_BY[freed_by](qs, leases, subscribed)
    finally:
        await admin.close()
        for x in (*leases, *channels):
            await x.close()


def test_a_long_topic_becomes_a_notify_channel_within_postgres_identifier_limit() -> None:
    from tenure.backends.postgres import PostgresChannel

    chan = PostgresChannel("postgresql://localhost/x")
    assert chan.name("quota:k") == "tenure_chan:quota:k"
    long = chan.name("quota:" + "x" * 100)
    assert len(long.encode()) <= 63 and long.startswith("tenure_chan:") and long != chan.name("quota:" + "y" * 100)


@pytest.mark.parametrize("with_redis", [False, True])
async def test_waiters_poll_at_least_once_a_heartbeat(tmp_path: Path, with_redis: bool) -> None:
    # A slot freed by expiry (its holder died) is found only by a waiter's poll: polling less often than once a
    # heartbeat would take it up later than one TTL plus one heartbeat after the death.
    from tenure.app import open_backends, open_quotas
    from tenure.settings import Settings

    settings = Settings.of(
        database_url=f"sqlite:///{tmp_path}/q.db",
        heartbeat_s=0.125,
        claim_ttl_s=0.5,
        redis_url=REDIS_URL if with_redis else None,
        quotas={"k": QuotaSpec("k", 1)},
    )
    backends = await open_backends(settings)
    try:
        async with open_quotas(settings, backends) as quotas:
            assert quotas.poll_s <= settings.worker.heartbeat_s
    finally:
        await backends.close()


# -- a process frozen (SIGSTOP, a VM pause) for longer than the lease TTL -------------------------------------------
# Found by the chaos run (bench/chaos.py, seed 7, PostgreSQL + Redis): a worker SIGSTOPped for 3.9 s with a 2.5 s TTL
# sent two model calls the moment it was resumed, on leases that had expired while it was frozen and whose slots
# other workers held: the mock model counted 6 calls in flight under a quota of 4. The freeze is simulated here by
# blocking the event loop with time.sleep, which is what a frozen process looks like from the inside: the server's
# clock went on, none of the process's own timers ran.
FROZEN_TTL = 1.0


async def test_a_block_frozen_past_the_ttl_makes_no_call_on_its_lapsed_lease(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    import time

    leases = await open_leases()
    q = QuotaManager(leases, {"k": QuotaSpec("k", 1)}, ttl_s=FROZEN_TTL, poll_s=0.05)
    loop = asyncio.get_running_loop()
    calls: list[str] = []

    async def heartbeat() -> None:  # the worker's quota heartbeat: a renewal every third of the TTL
        while True:
            await asyncio.sleep(FROZEN_TTL / 3)
            await q.renew()

    beat: asyncio.Task[None] | None = None
    try:
        with pytest.raises(LeaseLost):
            async with ExecutionQuotas(q, "x").quota("k"):
                beat = asyncio.create_task(heartbeat())
                loop.call_later(0.02, time.sleep, FROZEN_TTL * 1.5)  # frozen while connecting to the model
                await asyncio.sleep(0.1)
                calls.append("the upstream call")  # resumed: the lease expired 0.5 s ago
    finally:
        if beat is not None:
            beat.cancel()
    assert calls == [], "a call went upstream on a lease that had expired while the process was frozen"


async def test_a_slot_granted_just_before_a_freeze_past_the_ttl_is_not_used_without_being_confirmed(
    open_leases: Callable[[], Awaitable[Leases]],
) -> None:
    import time

    leases = await open_leases()
    frozen = []

    class FrozenAfterTheGrant:
        """The real backend; the first acquire's answer is read only after the process was frozen for 1.5 TTLs."""

        def __getattr__(self, name: str) -> object:
            return getattr(leases, name)

        async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
            granted = await leases.acquire_in_line(key, ticket, limit, ttl_s)
            if not frozen:
                frozen.append(ticket)
                asyncio.get_running_loop().call_soon(time.sleep, FROZEN_TTL * 1.5)
                await asyncio.sleep(0)  # the loop runs the freeze before this coroutine goes on
            return granted

    q = QuotaManager(FrozenAfterTheGrant(), {"k": QuotaSpec("k", 1)}, ttl_s=FROZEN_TTL, poll_s=0.05)  # type: ignore[arg-type]
    async with ExecutionQuotas(q, "x").quota("k"):
        # The upstream call starts here: the slot must be ours on the server now, not only before the freeze.
        assert await leases.holders("k") == ["x:0"], "the block runs on a lease that expired while the process was frozen"
    assert frozen
