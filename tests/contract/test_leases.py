"""The `Leases` contract, run against every lease backend with real servers (no mocks).

A backend joins the suite with one line in `BACKENDS`: its name and a factory `open(namespace, drop=...)`, an
async context manager yielding a `Leases`. Every call with the same `namespace` must see the same leases, in
this process and in the helper processes the crash tests start; on exit with `drop=True` it removes every
lease stored under the namespace and releases its connections.

The multi-process tests run this file as a script (`python test_leases.py '<json>'`): a supervisor that
imports everything once and then forks the contending processes, because starting fifty interpreters
that each import redis would cost about twenty CPU-seconds on a two-core machine. Every fork is a real
process with its own event loop and its own connections; they stop when their stdin closes, so they die
with the test even if it is killed, and the test SIGKILLs their whole process group in `finally` anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
import pytest
import redis.asyncio
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError

import tenure.backends.redis
from tenure.backends.postgres import PostgresLeases, PostgresStore
from tenure.backends.redis import RedisLeases
from tenure.backends.redis._scripts import generation_key
from tenure.backends.sqlite import SqliteLeases, SqliteStore, database_files
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.leases import InLine
from tenure.contracts.store import LeaseRef, Leases, line_key, new_ticket

if TYPE_CHECKING:  # only for annotations: this file also runs as a script, where `tests` is not importable
    from tests.integration.redisproc import RedisProc

# tests/conftest.py starts a private redis-server (PRIVATE_TEST_REDIS_URL) unless one is named.
REDIS_URL = os.environ.get("TENURE_TEST_REDIS_URL") or os.environ.get("PRIVATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Test clients name their version, as `RedisLeases` does: otherwise redis-py reads it from the package
# metadata (a blocking file read) on the event loop for every new connection.
_DRIVER = DriverInfo(lib_version=redis.__version__)

# The directory `tenure` is imported from, handed to the contender processes on PYTHONPATH.
_SRC = Path(tenure.backends.redis.__file__).resolve().parents[3]


class LeaseFactory(Protocol):
    """Open the leases of one test namespace; on exit with `drop=True`, delete them."""

    def __call__(self, namespace: str, *, drop: bool = True) -> AbstractAsyncContextManager[Leases]: ...


def _redis_prefix(namespace: str) -> str:
    return f"tenure-test:{namespace}:lease:"


async def establish_lease_state(url: str, prefix: str) -> None:
    """Mark the lease state of `prefix` as begun long ago. A Redis without it cannot be told from one that has just
    lost its leases, so it grants nothing new for one TTL (docs/quotas.md); a test that wants grants at once on a
    fresh prefix says the state is old, as it is in a deployment that has run for a while."""
    client = redis.asyncio.Redis.from_url(url, driver_info=_DRIVER)
    try:
        await client.set(generation_key(prefix), 0)
    finally:
        await client.aclose()


@asynccontextmanager
async def open_redis(namespace: str, *, drop: bool = True) -> AsyncIterator[Leases]:
    """`RedisLeases` under a key prefix of its own, whose lease state the first opener (`drop=True`) marks as
    established; dropping deletes that prefix's keys (never FLUSHALL)."""
    if drop:
        await establish_lease_state(REDIS_URL, _redis_prefix(namespace))
    leases = RedisLeases(REDIS_URL, prefix=_redis_prefix(namespace))
    try:
        yield leases
    finally:
        try:
            if drop:
                client = redis.asyncio.Redis.from_url(REDIS_URL, driver_info=_DRIVER)
                try:
                    keys = [key async for key in client.scan_iter(match=f"tenure-test:{namespace}:*")]
                    if keys:
                        await client.delete(*keys)
                finally:
                    await client.aclose()
        finally:
            await leases.close()


PG_BASE = os.environ.get("TENURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_SQLITE_DIR = Path(os.environ.get("TMPDIR", "/tmp"))


def _sqlite_url(namespace: str) -> str:
    return f"sqlite:///{_SQLITE_DIR}/tenure-test-leases-{namespace}.db"


@asynccontextmanager
async def open_sqlite(namespace: str, *, drop: bool = True) -> AsyncIterator[Leases]:
    """`SqliteLeases` on the connection of a `SqliteStore`, as a process's `Backends` has them, on a database
    file of the namespace's own (created and migrated by the first opener, which passes `drop=True`); dropping
    deletes the file."""
    store = await SqliteStore.connect(_sqlite_url(namespace))
    try:
        if drop:
            await store.migrate()
        yield SqliteLeases(store.connection)
    finally:
        await store.close()
        if drop:
            for path in database_files(f"{_SQLITE_DIR}/tenure-test-leases-{namespace}.db"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


@asynccontextmanager
async def open_postgres(namespace: str, *, drop: bool = True) -> AsyncIterator[Leases]:
    """`PostgresLeases` (one connection) on a schema of the namespace's own, created and migrated by the
    first opener (`drop=True`), which drops it on exit. One connection per process keeps fifty contenders
    well inside the server's connection limit, which other test runs share."""
    schema = f"tl_{namespace[:16]}"
    url = f"{PG_BASE}?search_path={schema}"
    if drop:
        conn = await asyncpg.connect(PG_BASE)
        try:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        finally:
            await conn.close()
        store = await PostgresStore.connect(url, pool_size=1)
        try:
            await store.migrate()
        finally:
            await store.close()
    leases = await PostgresLeases.connect(url)
    try:
        yield leases
    finally:
        await leases.close()
        if drop:
            conn = await asyncpg.connect(PG_BASE)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()


BACKENDS: dict[str, LeaseFactory] = {
    "postgres": open_postgres,
    "redis": open_redis,
    "sqlite": open_sqlite,
}


# -- fixtures ----------------------------------------------------------------------------------------------
@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test."""
    return str(request.param)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test (or earlier run) uses."""
    return uuid.uuid4().hex


@pytest.fixture
async def leases(backend: str, namespace: str) -> AsyncIterator[Leases]:
    """The backend under test, emptied of this test's leases afterwards."""
    async with BACKENDS[backend](namespace) as opened:
        yield opened


@pytest.fixture
async def open_more(backend: str, namespace: str) -> AsyncIterator[Callable[[], Awaitable[Leases]]]:
    """Open further instances (own connections) on the same namespace; all closed after the test."""
    async with AsyncExitStack() as stack:

        async def open_one() -> Leases:
            return await stack.enter_async_context(BACKENDS[backend](namespace, drop=False))

        yield open_one


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, every_s: float = 0.01) -> float:
    """Poll `check` until it holds; return the seconds it took. Fails the test after `timeout_s`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        if loop.time() - started > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        await asyncio.sleep(every_s)
    return loop.time() - started


# -- single-process semantics ------------------------------------------------------------------------------
async def test_backend_implements_the_leases_protocol(leases: Leases) -> None:
    assert isinstance(leases, Leases)


async def test_acquire_twice_by_one_holder_takes_one_slot(leases: Leases) -> None:
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    assert await leases.holders("k") == ["a"]
    assert await leases.acquire("k", "b", limit=2, ttl_s=30)
    assert not await leases.acquire("k", "c", limit=2, ttl_s=30)
    assert sorted(await leases.holders("k")) == ["a", "b"]


async def test_release_twice_is_harmless_and_frees_exactly_one_slot(leases: Leases) -> None:
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    assert await leases.acquire("k", "b", limit=2, ttl_s=30)
    await leases.release("k", "a")
    await leases.release("k", "a")
    await leases.release("k", "never-held")
    await leases.release("unknown-key", "a")
    assert await leases.holders("k") == ["b"]
    assert await leases.acquire("k", "c", limit=2, ttl_s=30)
    assert not await leases.acquire("k", "d", limit=2, ttl_s=30)


async def test_limits_are_counted_per_key(leases: Leases) -> None:
    assert await leases.acquire("k1", "a", limit=1, ttl_s=30)
    assert await leases.acquire("k2", "b", limit=1, ttl_s=30)
    assert not await leases.acquire("k1", "b", limit=1, ttl_s=30)
    assert await leases.holders("k1") == ["a"]
    assert await leases.holders("k2") == ["b"]
    assert await leases.holders("k3") == []


async def test_a_holder_that_stops_renewing_loses_its_slot_after_the_ttl(leases: Leases) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await leases.acquire("k", "silent", limit=1, ttl_s=1.0)
    assert not await leases.acquire("k", "next", limit=1, ttl_s=30)
    await asyncio.sleep(0.5)
    assert not await leases.acquire("k", "next", limit=1, ttl_s=30)

    async def next_gets_the_slot() -> bool:
        return await leases.acquire("k", "next", limit=1, ttl_s=30)

    await _eventually(next_gets_the_slot, timeout_s=3.0, every_s=0.02)
    # The expiry is server time at acquire + ttl, and the acquire happened after `started`.
    assert loop.time() - started >= 0.95
    assert await leases.holders("k") == ["next"]
    assert await leases.renew([LeaseRef("k", "silent")], ttl_s=1.0) == [LeaseRef("k", "silent")]


async def test_renewing_keeps_a_live_holder_for_many_ttls_while_contenders_are_refused(
    leases: Leases,
) -> None:
    # 2 s, renewed every 0.25 s: a 2-core machine shared with other test runs has stalled a renewal by more
    # than the 1 s of slack a 1.5 s TTL renewed every 0.5 s left (load average ~20). Counted renewals, not a
    # time budget, for the same reason.
    ttl = 2.0
    held = [LeaseRef("k", "live")]
    assert await leases.acquire("k", "live", limit=1, ttl_s=ttl)
    for renewals in range(1, 33):  # four TTLs of life
        await asyncio.sleep(ttl / 8)
        assert await leases.renew(held, ttl_s=ttl) == []
        assert not await leases.acquire("k", f"contender-{renewals}", limit=1, ttl_s=ttl)
    assert await leases.holders("k") == ["live"]


async def test_renew_reports_leases_released_from_outside_as_lost(
    leases: Leases, open_more: Callable[[], Awaitable[Leases]]
) -> None:
    other = await open_more()
    assert await leases.acquire("k1", "a", limit=5, ttl_s=30)
    assert await leases.acquire("k2", "a", limit=5, ttl_s=30)
    assert await leases.acquire("k2", "b", limit=5, ttl_s=30)
    await other.release("k1", "a")
    held = [LeaseRef("k1", "a"), LeaseRef("k2", "a"), LeaseRef("k2", "b"), LeaseRef("k3", "never")]
    assert await leases.renew(held, ttl_s=30) == [LeaseRef("k1", "a"), LeaseRef("k3", "never")]
    # Renewal does not bring a lost lease back.
    assert await leases.holders("k1") == []
    assert sorted(await leases.holders("k2")) == ["a", "b"]


async def test_renew_of_an_expired_lease_reports_it_lost_even_if_nobody_took_the_slot(leases: Leases) -> None:
    assert await leases.acquire("k", "late", limit=1, ttl_s=0.2)
    await asyncio.sleep(0.4)
    assert await leases.renew([LeaseRef("k", "late")], ttl_s=30) == [LeaseRef("k", "late")]
    assert await leases.holders("k") == []


async def test_holders_are_listed_soonest_expiry_first(leases: Leases) -> None:
    assert await leases.acquire("k", "z-long", limit=3, ttl_s=60)
    assert await leases.acquire("k", "a-short", limit=3, ttl_s=20)
    assert await leases.acquire("k", "m-mid", limit=3, ttl_s=40)
    assert await leases.holders("k") == ["a-short", "m-mid", "z-long"]


async def test_a_negative_limit_or_a_non_positive_ttl_is_a_value_error(leases: Leases) -> None:
    with pytest.raises(ValueError):
        await leases.acquire("k", "a", limit=-1, ttl_s=30)
    with pytest.raises(ValueError):
        await leases.acquire("k", "a", limit=1, ttl_s=0)
    with pytest.raises(ValueError):
        await leases.renew([LeaseRef("k", "a")], ttl_s=-1)
    assert await leases.holders("k") == []


async def test_renew_of_nothing_is_nothing(leases: Leases) -> None:
    assert await leases.renew([], ttl_s=30) == []


async def test_a_thousand_concurrent_acquires_admit_exactly_the_limit(
    leases: Leases, open_more: Callable[[], Awaitable[Leases]]
) -> None:
    limit = 7
    clients = [leases, *[await open_more() for _ in range(3)]]
    results = await asyncio.gather(
        *(clients[i % len(clients)].acquire("burst", f"h{i}", limit=limit, ttl_s=30) for i in range(1000))
    )
    winners = {f"h{i}" for i, won in enumerate(results) if won}
    assert len(winners) == limit
    assert set(await leases.holders("burst")) == winners


# -- the waiting line (FIFO acquire, release with hand-over) ------------------------------------------------
async def test_acquire_in_line_takes_a_free_slot_when_nobody_waits(leases: Leases) -> None:
    ticket = new_ticket("a")
    assert (await leases.acquire_in_line("k", ticket, limit=1, ttl_s=30)).held
    assert await leases.holders("k") == ["a"]
    assert await leases.holders(line_key("k")) == []
    assert (await leases.acquire_in_line("k", ticket, limit=1, ttl_s=30)).held, "idempotent for its holder"
    assert await leases.holders("k") == ["a"]


async def test_a_full_key_queues_the_ticket_and_a_release_hands_the_slot_to_the_oldest(leases: Leases) -> None:
    assert (await leases.acquire_in_line("k", new_ticket("a"), limit=1, ttl_s=30)).held
    first, second = new_ticket("b"), new_ticket("c")
    assert not (await leases.acquire_in_line("k", first, limit=1, ttl_s=30)).held
    assert not (await leases.acquire_in_line("k", second, limit=1, ttl_s=30)).held
    assert not (await leases.acquire_in_line("k", first, limit=1, ttl_s=30)).held, "waiting again keeps one ticket"
    assert sorted(await leases.holders(line_key("k"))) == [first, second]
    assert await leases.release_and_hand_over("k", "a", limit=1, ttl_s=30) == [first]
    assert await leases.holders("k") == ["b"]
    assert await leases.holders(line_key("k")) == [second]
    # The served waiter learns it holds the slot (acquire_in_line answers True and does not queue it again).
    assert (await leases.acquire_in_line("k", first, limit=1, ttl_s=30)).held
    assert await leases.holders(line_key("k")) == [second]
    assert await leases.release_and_hand_over("k", "b", limit=1, ttl_s=30) == [second]
    assert await leases.release_and_hand_over("k", "c", limit=1, ttl_s=30) == []
    assert await leases.release_and_hand_over("k", "c", limit=1, ttl_s=30) == [], "harmless twice"
    assert await leases.holders("k") == []


async def test_a_newcomer_does_not_overtake_older_tickets_for_a_free_slot(leases: Leases) -> None:
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    assert await leases.acquire("k", "b", limit=2, ttl_s=30)
    old = new_ticket("old")
    assert not (await leases.acquire_in_line("k", old, limit=2, ttl_s=30)).held
    await leases.release("k", "a")  # freed without a hand-over (as an expiry would)
    new = new_ticket("new")
    # The newcomer's poll finds the slot free for the older ticket and hands it over, as a release would: a slot
    # that came free by expiry waits for no particular waiter's poll.
    assert await leases.acquire_in_line("k", new, limit=2, ttl_s=30) == InLine(False, (old,))
    assert sorted(await leases.holders("k")) == ["b", "old"]
    assert await leases.holders(line_key("k")) == [new]
    assert (await leases.acquire_in_line("k", old, limit=2, ttl_s=30)).held, "the served waiter learns it holds it"
    assert sorted(await leases.holders("k")) == ["b", "old"]
    assert await leases.acquire_in_line("k", new, limit=2, ttl_s=30) == InLine(False), "no slot free: none served"


async def test_a_release_hands_every_free_slot_oldest_first(leases: Leases) -> None:
    for h in ("a", "b", "c"):
        assert await leases.acquire("k", h, limit=3, ttl_s=30)
    tickets = [new_ticket(f"w{i}") for i in range(4)]
    for t in reversed(tickets):  # queued newest first: the order is the tickets', not the calls'
        assert not (await leases.acquire_in_line("k", t, limit=3, ttl_s=30)).held
    await leases.release("k", "a")
    await leases.release("k", "b")
    assert await leases.release_and_hand_over("k", "c", limit=3, ttl_s=30) == tickets[:3]
    assert sorted(await leases.holders("k")) == ["w0", "w1", "w2"]
    assert await leases.holders(line_key("k")) == [tickets[3]]


async def test_an_expired_ticket_is_never_handed_a_slot(leases: Leases) -> None:
    assert await leases.acquire("k", "a", limit=1, ttl_s=30)
    dead, alive = new_ticket("dead"), new_ticket("alive")
    assert not (await leases.acquire_in_line("k", dead, limit=1, ttl_s=0.2)).held
    assert not (await leases.acquire_in_line("k", alive, limit=1, ttl_s=30)).held
    await asyncio.sleep(0.4)
    assert await leases.release_and_hand_over("k", "a", limit=1, ttl_s=30) == [alive]
    assert await leases.holders("k") == ["alive"]


async def test_a_slot_handed_over_lasts_only_as_long_as_the_served_ticket_would_have(leases: Leases) -> None:
    # The ticket's last renewal is the last sign of life of its waiter: a waiter that died in line must not be
    # handed a slot for a fresh TTL (its slot would come back one TTL after the hand-over, not after its death).
    loop = asyncio.get_running_loop()
    assert await leases.acquire("k", "a", limit=1, ttl_s=30)
    ticket = new_ticket("dead")
    queued_at = loop.time()
    assert not (await leases.acquire_in_line("k", ticket, limit=1, ttl_s=1.0)).held
    assert await leases.release_and_hand_over("k", "a", limit=1, ttl_s=30) == [ticket]
    assert await leases.holders("k") == ["dead"]

    async def free_again() -> bool:
        return await leases.acquire("k", "next", limit=1, ttl_s=30)

    await _eventually(free_again, timeout_s=5.0, every_s=0.02)
    assert loop.time() - queued_at < 2.0, "the handed-over slot outlived its ticket"
    assert await leases.holders("k") == ["next"]


async def test_concurrent_acquires_in_line_admit_exactly_the_limit(
    leases: Leases, open_more: Callable[[], Awaitable[Leases]]
) -> None:
    limit = 7
    clients = [leases, *[await open_more() for _ in range(3)]]
    tickets = [new_ticket(f"h{i}") for i in range(200)]
    results = await asyncio.gather(
        *(clients[i % len(clients)].acquire_in_line("burst", t, limit, 30) for i, t in enumerate(tickets))
    )
    # A call takes a slot, or hands free ones to older tickets that queued before it: each slot goes once.
    assert sum(r.held + len(r.served) for r in results) == limit
    assert len(await leases.holders("burst")) == limit
    assert len(await leases.holders(line_key("burst"))) == len(tickets) - limit


# -- many processes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SwarmConfig:
    """What every forked contender does: loop acquire → hold (renewing) → release on one key."""

    backend: str
    namespace: str
    key: str
    processes: int
    limit: int
    ttl_s: float
    hold_s: tuple[float, float]
    retry_s: tuple[float, float]
    renew_every_s: float
    max_run_s: float = 60.0


@dataclass
class Swarm:
    """The supervisor process and what its contenders reported on stdout."""

    process: asyncio.subprocess.Process
    ready: set[int]
    reports: list[dict[str, Any]]
    exits: dict[int, int]

    async def _read_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout_s):
            while not done():
                line = await self.process.stdout.readline()
                if not line:
                    return
                message = json.loads(line)
                if "ready" in message:
                    self.ready.add(message["ready"])
                elif "report" in message:
                    self.reports.append(message)
                elif "exit" in message:
                    self.exits[message["exit"]] = message["status"]

    async def wait_ready(self, processes: int, timeout_s: float = 30.0) -> None:
        """Wait until every contender is connected and contending."""
        await self._read_until(lambda: len(self.ready) >= processes, timeout_s)
        assert len(self.ready) == processes, f"only {len(self.ready)} of {processes} contenders started"

    async def stop(self, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Close the contenders' stdin (their stop signal) and collect their reports until all have exited."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self._read_until(lambda: False, timeout_s)
        async with asyncio.timeout(timeout_s):
            await self.process.wait()
        return self.reports


def _pid_of(holder: str) -> int:
    return int(holder.split("-")[0].removeprefix("p"))


@asynccontextmanager
async def swarm(config: SwarmConfig) -> AsyncIterator[Swarm]:
    """Start the supervisor, which forks `config.processes` contenders; kill them all on the way out."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        json.dumps(asdict(config)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        # Its own process group, so one killpg reaches every fork, even after the supervisor has died.
        start_new_session=True,
    )
    try:
        yield Swarm(process, set(), [], {})
    finally:
        if process.returncode is None and process.stdin is not None:
            process.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def _sample_holder_counts(leases: Leases, key: str, until: asyncio.Event, counts: list[int]) -> None:
    while not until.is_set():
        counts.append(len(await leases.holders(key)))
        await asyncio.sleep(0.005)


@pytest.mark.slow
async def test_limit_holds_under_contention_from_fifty_processes(backend: str, namespace: str, leases: Leases) -> None:
    limit = 5
    config = SwarmConfig(
        backend=backend,
        namespace=namespace,
        key="contended",
        processes=50,
        limit=limit,
        ttl_s=10.0,
        hold_s=(0.005, 0.03),
        retry_s=(0.005, 0.02),
        renew_every_s=3.0,
    )
    counts: list[int] = []
    async with swarm(config) as contenders:
        await contenders.wait_ready(config.processes)
        stop_sampling = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_sample_holder_counts(leases, config.key, stop_sampling, counts))
            await asyncio.sleep(3.0)
            reports = await contenders.stop()
            stop_sampling.set()

    assert len(counts) >= 50, "the sampler barely ran"
    assert max(counts) <= limit, f"{max(counts)} holders seen at once with limit {limit}"
    assert max(counts) == limit, "the limit was never reached: there was no real contention"
    assert len(reports) == config.processes
    assert all(r["errors"] == [] for r in reports), [r["errors"] for r in reports if r["errors"]]
    assert sum(r["refused"] for r in reports) > 0
    assert sum(r["acquired"] for r in reports) > config.processes
    assert await leases.holders(config.key) == []


@pytest.mark.slow
async def test_slots_of_sigkilled_holders_come_back_within_ttl_plus_a_renew_interval(
    backend: str, namespace: str, leases: Leases
) -> None:
    limit, ttl = 5, 1.0
    renew_every = ttl / 3
    config = SwarmConfig(
        backend=backend,
        namespace=namespace,
        key="crashy",
        processes=50,
        limit=limit,
        ttl_s=ttl,
        hold_s=(2.0, 4.0),
        retry_s=(0.01, 0.04),
        renew_every_s=renew_every,
    )
    counts: list[int] = []
    loop = asyncio.get_running_loop()
    async with swarm(config) as contenders:
        await contenders.wait_ready(config.processes)

        async def full() -> bool:
            return len(await leases.holders(config.key)) == limit

        await _eventually(full, timeout_s=10.0)
        stop_sampling = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_sample_holder_counts(leases, config.key, stop_sampling, counts))
            victims = {_pid_of(h) for h in await leases.holders(config.key)}
            victims = set(sorted(victims)[:3])
            assert len(victims) == 3
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            killed_at = loop.time()
            victims_gone_after: float | None = None
            while True:
                current = await leases.holders(config.key)
                elapsed = loop.time() - killed_at
                if victims_gone_after is None and not any(_pid_of(h) in victims for h in current):
                    victims_gone_after = elapsed
                if victims_gone_after is not None and len(current) == limit:
                    recovered_after = elapsed
                    break
                if elapsed > ttl + renew_every + 5:
                    pytest.fail(f"slots not back {elapsed:.2f} s after the kill: holders {current}")
                await asyncio.sleep(0.005)
            reports = await contenders.stop()
            stop_sampling.set()

    assert victims_gone_after is not None
    assert victims_gone_after <= ttl + renew_every, f"dead holders stayed {victims_gone_after:.2f} s"
    assert recovered_after <= ttl + renew_every, f"slots came back after {recovered_after:.2f} s"
    assert max(counts) <= limit, f"{max(counts)} holders seen at once with limit {limit}"
    assert {r["report"] for r in reports} == contenders.ready - victims
    assert all(contenders.exits[pid] == -signal.SIGKILL for pid in victims)
    assert all(r["errors"] == [] for r in reports), [r["errors"] for r in reports if r["errors"]]
    assert await leases.holders(config.key) == []


# -- Redis only: the layout and the edge -------------------------------------------------------------------
@pytest.fixture
async def raw_redis() -> AsyncIterator[redis.asyncio.Redis]:
    """A plain client to inspect what `RedisLeases` wrote."""
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True, driver_info=_DRIVER)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_leases(namespace: str) -> AsyncIterator[RedisLeases]:
    """`RedisLeases` alone, for the tests of its Redis layout."""
    async with open_redis(namespace) as opened:
        assert isinstance(opened, RedisLeases)
        yield opened


async def test_redis_scores_are_expiries_on_the_redis_clock(
    redis_leases: RedisLeases, raw_redis: redis.asyncio.Redis
) -> None:
    seconds, micros = await raw_redis.time()
    before_ms = seconds * 1000 + micros // 1000
    assert await redis_leases.acquire("clock", "a", limit=1, ttl_s=10)
    key = redis_leases.prefix + "clock"
    score = await raw_redis.zscore(key, "a")
    assert score is not None
    assert before_ms + 10_000 <= score <= before_ms + 10_000 + 1_000
    assert 19_000 < await raw_redis.pttl(key) <= 20_000


async def test_redis_key_life_is_extended_never_shortened(redis_leases: RedisLeases, raw_redis: redis.asyncio.Redis) -> None:
    assert await redis_leases.acquire("mixed", "long", limit=2, ttl_s=30)
    assert await redis_leases.acquire("mixed", "short", limit=2, ttl_s=0.1)
    assert await raw_redis.pttl(redis_leases.prefix + "mixed") > 55_000


async def test_redis_from_client_leaves_the_callers_client_open(namespace: str, raw_redis: redis.asyncio.Redis) -> None:
    await establish_lease_state(REDIS_URL, _redis_prefix(namespace))
    shared = RedisLeases.from_client(raw_redis, prefix=_redis_prefix(namespace))
    assert await shared.acquire("k", "a", limit=1, ttl_s=30)
    await shared.close()
    assert await raw_redis.delete(shared.prefix + "k", generation_key(shared.prefix)) == 2


# -- Redis only: losing the lease state (a private redis-server, flushed or restarted without persistence) ------
LOSS_TTL_S = 1.0


@pytest.fixture
async def private_leases(private_redis: RedisProc, namespace: str) -> AsyncIterator[RedisLeases]:
    """`RedisLeases` on a redis-server of this test's own, with an established lease state."""
    await establish_lease_state(private_redis.url, _redis_prefix(namespace))
    leases = RedisLeases(private_redis.url, prefix=_redis_prefix(namespace), timeout_s=2.0)
    try:
        yield leases
    finally:
        await leases.close()


@pytest.mark.parametrize("loss", ["flushall", "restart"])
async def test_redis_grants_nothing_new_for_one_ttl_after_losing_its_leases(
    private_leases: RedisLeases, private_redis: RedisProc, loss: str
) -> None:
    leases, ttl = private_leases, LOSS_TTL_S
    loop = asyncio.get_running_loop()
    old = [LeaseRef("k", h) for h in ("a", "b", "c")]
    for ref in old:
        assert await leases.acquire("k", ref.holder, limit=3, ttl_s=ttl)
    if loss == "flushall":
        private_redis.flushall()
    else:
        private_redis.restart()
    lost_at = loop.time()
    # The old holders may still be calling upstream until their next renewal: a newcomer must not join them.
    assert not await leases.acquire("k", "new", limit=3, ttl_s=ttl)
    first, second = new_ticket("first"), new_ticket("second")
    assert not (await leases.acquire_in_line("k", first, limit=3, ttl_s=ttl)).held
    assert not (await leases.acquire_in_line("k", second, limit=3, ttl_s=ttl)).held
    assert await leases.renew(old, ttl_s=ttl) == old, "the old holders learn at their renewal that they lost"
    assert await leases.release_and_hand_over("k", "a", limit=3, ttl_s=ttl) == [], "a hand-over grants too"
    assert not await leases.acquire("k", "a", limit=3, ttl_s=ttl), "an old holder is a new holder now"
    assert await leases.holders("k") == []

    async def first_served() -> bool:
        # Both waiters poll, as the quota manager's do (which also keeps their tickets alive); one slot is asked for.
        assert not (await leases.acquire_in_line("k", second, limit=1, ttl_s=ttl)).held, "the second overtook the first"
        return (await leases.acquire_in_line("k", first, limit=1, ttl_s=ttl)).held

    await _eventually(first_served, timeout_s=5 * ttl)
    assert loop.time() - lost_at >= ttl, "a slot was granted within one TTL of the loss"
    assert not (await leases.acquire_in_line("k", new_ticket("late"), limit=2, ttl_s=ttl)).held, "the line kept its order"
    assert (await leases.acquire_in_line("k", second, limit=2, ttl_s=ttl)).held
    assert sorted(await leases.holders("k")) == ["first", "second"]


async def test_a_new_redis_waits_one_ttl_before_its_first_grant(private_redis: RedisProc, namespace: str) -> None:
    # Redis cannot tell a new server from one that has just lost its leases: the same rule holds for both.
    leases = RedisLeases(private_redis.url, prefix=_redis_prefix(namespace))
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert not await leases.acquire("k", "a", limit=1, ttl_s=LOSS_TTL_S)

        async def granted() -> bool:
            return await leases.acquire("k", "a", limit=1, ttl_s=LOSS_TTL_S)

        await _eventually(granted, timeout_s=5 * LOSS_TTL_S)
        assert loop.time() - started >= LOSS_TTL_S
    finally:
        await leases.close()


async def test_existing_leases_live_on_when_only_the_generation_key_is_lost(
    private_leases: RedisLeases, private_redis: RedisProc
) -> None:
    # Only new leases wait: a lease Redis still has is renewed and refreshed as usual.
    leases = private_leases
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    client = redis.asyncio.Redis.from_url(private_redis.url, driver_info=_DRIVER)
    try:
        assert await client.delete(generation_key(leases.prefix)) == 1
    finally:
        await client.aclose()
    assert await leases.renew([LeaseRef("k", "a")], ttl_s=30) == []
    assert await leases.acquire("k", "a", limit=2, ttl_s=30)
    assert not await leases.acquire("k", "b", limit=2, ttl_s=30)
    assert await leases.holders("k") == ["a"]


async def test_unreachable_redis_raises_leases_unavailable_from_the_driver_error() -> None:
    dead = RedisLeases("redis://127.0.0.1:1/0", timeout_s=1.0)
    try:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: dead.acquire("k", "a", limit=1, ttl_s=1),
            lambda: dead.renew([LeaseRef("k", "a")], ttl_s=1),
            lambda: dead.release("k", "a"),
            lambda: dead.holders("k"),
            dead.ping,
        ]
        for call in calls:
            with pytest.raises(LeasesUnavailable) as caught:
                await call()
            assert isinstance(caught.value.__cause__, RedisError)
    finally:
        await dead.close()


async def test_a_redis_that_never_answers_is_reported_after_one_timeout_not_retried() -> None:
    """A silent network (a partition, a frozen server) is a reply that never comes: the lease client reports it
    after one `timeout_s`, so the quota layer can fail closed or open at once; only a broken connection is
    retried. Counted in connections the silent server accepted (each retry reconnects), not in seconds."""
    connections = 0

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent = RedisLeases(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
    try:
        with pytest.raises(LeasesUnavailable, match="Timeout"):
            await silent.acquire("k", "a", limit=1, ttl_s=1)
        assert connections == 1
    finally:
        await silent.close()
        server.close()


# -- the contender processes (this file run as a script) ---------------------------------------------------
def _emit(message: dict[str, Any]) -> None:
    # One write(2) of a short line is atomic on a pipe, so fifty processes never interleave their lines.
    os.write(1, (json.dumps(message) + "\n").encode())


async def _contend(config: SwarmConfig) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_stdin() -> None:
        # stdin is never written to: readable means end of file, the test's signal to stop.
        with contextlib.suppress(BlockingIOError):
            if not os.read(0, 4096):
                stop.set()

    async def pause(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stop.wait()

    loop.add_reader(0, on_stdin)
    rng = random.Random(os.getpid())
    pid = os.getpid()
    counts = {"acquired": 0, "refused": 0, "lost": 0}
    errors: list[str] = []
    try:
        async with BACKENDS[config.backend](config.namespace, drop=False) as leases:
            await leases.holders(config.key)  # connected and answering
            _emit({"ready": pid})
            deadline = loop.time() + config.max_run_s
            attempt = 0
            while not stop.is_set() and loop.time() < deadline:
                attempt += 1
                holder = f"p{pid}-{attempt}"
                try:
                    if not await leases.acquire(config.key, holder, config.limit, config.ttl_s):
                        counts["refused"] += 1
                        await pause(rng.uniform(*config.retry_s))
                        continue
                    counts["acquired"] += 1
                    try:
                        release_at = loop.time() + rng.uniform(*config.hold_s)
                        while not stop.is_set() and loop.time() < release_at:
                            await pause(min(config.renew_every_s, release_at - loop.time()))
                            if loop.time() < release_at and not stop.is_set():
                                if await leases.renew([LeaseRef(config.key, holder)], config.ttl_s):
                                    counts["lost"] += 1
                                    break
                    finally:
                        await leases.release(config.key, holder)
                except Exception:
                    errors.append(traceback.format_exc())
                    await pause(0.05)
    finally:
        loop.remove_reader(0)
        _emit({"report": pid, "errors": errors, **counts})


def _supervise(config: SwarmConfig) -> int:
    """Fork the contenders (before any event loop or thread exists, so forking is safe) and reap them."""
    os.set_blocking(0, False)
    children = []
    for _ in range(config.processes):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                asyncio.run(_contend(config))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        _emit({"exit": pid, "status": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    _config = json.loads(sys.argv[1])
    _config["hold_s"] = tuple(_config["hold_s"])
    _config["retry_s"] = tuple(_config["retry_s"])
    sys.exit(_supervise(SwarmConfig(**_config)))
