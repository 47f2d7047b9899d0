"""The Redis ready index (backends/redis/ready_index.py) on a real redis-server of the test's own: the high band
is read before the normal one, a dead consumer's deliveries are taken over by `XAUTOCLAIM` once stale, a hint
left unacknowledged stays pending for another consumer, and a flushed index asks to be rebuilt."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from tenure.backends.redis import RedisReadyIndex
from tenure.contracts.ready import ReadyHint
from tests.integration.redisproc import RedisProc

STALE_S = 0.3


@pytest.fixture
async def index(private_redis: RedisProc) -> AsyncIterator[RedisReadyIndex]:
    idx = RedisReadyIndex(private_redis.url, prefix=f"t:{uuid.uuid4().hex}:", stale_s=STALE_S, max_block_s=0.05)
    try:
        yield idx
    finally:
        await idx.close()


def _hints(agent: str, priority: int, n: int) -> list[ReadyHint]:
    return [ReadyHint(f"{agent}-{priority}-{i}", agent, priority) for i in range(n)]


async def test_the_high_band_is_read_before_the_normal_one(index: RedisReadyIndex) -> None:
    await index.take("w1", ["a"], 1, 0.01)  # creates the groups (a first take asks for a rebuild)
    await index.publish(_hints("a", 0, 3))
    await index.publish(_hints("a", 5, 2))
    first = await index.take("w1", ["a"], 5, 0.01)
    assert sorted(d.job_id for d in first) == ["a-5-0", "a-5-1"], "the high band must be served first"
    await index.ack(first)
    second = await index.take("w1", ["a"], 5, 0.01)
    assert sorted(d.job_id for d in second) == ["a-0-0", "a-0-1", "a-0-2"]


async def test_a_dead_consumers_deliveries_are_taken_over_once_stale(private_redis: RedisProc) -> None:
    prefix = f"t:{uuid.uuid4().hex}:"
    dead = RedisReadyIndex(private_redis.url, prefix=prefix, stale_s=STALE_S, max_block_s=0.05)
    alive = RedisReadyIndex(private_redis.url, prefix=prefix, stale_s=STALE_S, max_block_s=0.05)
    try:
        await dead.take("dead", ["a"], 1, 0.01)
        await dead.publish(_hints("a", 0, 2) + _hints("a", 3, 1))
        taken = await dead.take("dead", ["a"], 5, 0.01) + await dead.take("dead", ["a"], 5, 0.01)
        assert sorted(d.job_id for d in taken) == ["a-0-0", "a-0-1", "a-3-0"]
        # "dead" never acknowledges. Before they are stale, "alive" gets nothing of them.
        assert await alive.take("alive", ["a"], 5, 0.01) == []
        began = time.monotonic()
        got: list[str] = []
        while len(got) < 3 and time.monotonic() - began < 5:
            got += [d.job_id for d in await alive.take("alive", ["a"], 5, 0.05)]
            await asyncio.sleep(0.02)
        assert sorted(got) == ["a-0-0", "a-0-1", "a-3-0"], got
        assert time.monotonic() - began >= STALE_S * 0.8, "taken over before they were stale"
    finally:
        await dead.close()
        await alive.close()


async def test_an_unacknowledged_hint_stays_pending_and_an_acknowledged_one_is_gone(index: RedisReadyIndex) -> None:
    await index.take("w1", ["a"], 1, 0.01)
    await index.publish(_hints("a", 0, 2))
    taken = await index.take("w1", ["a"], 5, 0.01)
    assert len(taken) == 2
    await index.ack([d for d in taken if d.job_id == "a-0-0"])
    await asyncio.sleep(STALE_S + 0.05)
    again: list[str] = []
    for _ in range(20):
        again += [d.job_id for d in await index.take("w2", ["a"], 5, 0.05)]
        if again:
            break
        await asyncio.sleep(STALE_S / 4)
    assert again == ["a-0-1"]


async def test_a_flushed_index_asks_to_be_rebuilt(index: RedisReadyIndex, private_redis: RedisProc) -> None:
    await index.take("w1", ["a"], 1, 0.01)
    index.rebuild_needed = False
    private_redis.flushall()
    assert await index.take("w1", ["a"], 1, 0.01) == []
    await index.take("w1", ["a"], 1, 0.01)  # the groups are created again
    assert index.rebuild_needed


async def test_a_preferred_workers_hint_reaches_it_even_when_another_consumer_took_the_agents(
    private_redis: RedisProc,
) -> None:
    # A job preferred to w2 (docs/routing.md) is hinted on its agent's stream, which hands it to one consumer
    # (w1 here, which may not claim it during the grace), and on w2's own stream, so w2 is woken all the same.
    prefix = f"t:{uuid.uuid4().hex}:"
    w1 = RedisReadyIndex(private_redis.url, prefix=prefix, stale_s=30, max_block_s=0.05)
    w2 = RedisReadyIndex(private_redis.url, prefix=prefix, stale_s=30, max_block_s=0.05)
    try:
        await w1.take("w1", ["a"], 1, 0.01)
        await w2.take("w2", ["a"], 1, 0.01)
        w1.rebuild_needed = w2.rebuild_needed = False
        await w1.publish([ReadyHint("job-1", "a", 0, worker="w2")])
        first = await w1.take("w1", ["a"], 5, 0.01)
        assert [(d.job_id, d.agent) for d in first] == [("job-1", "a")]  # the agent's stream: w1 got it first
        mine = await w2.take("w2", ["a"], 5, 0.01)
        assert [(d.job_id, d.agent, d.stream) for d in mine] == [("job-1", "a", w2.worker_stream("w2"))]
        assert not w2.rebuild_needed  # a worker's own new stream is no lost index
        await w2.ack(mine)
        assert await w2.take("w2", ["a"], 5, 0.01) == []
        ttl = await w2._client.ttl(w2.worker_stream("w2"))
        assert 0 < ttl <= 3600  # collected by Redis one TTL after its owner stopped reading it
    finally:
        await w1.close()
        await w2.close()
