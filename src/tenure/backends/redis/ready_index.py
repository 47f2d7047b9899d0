"""`RedisReadyIndex`: the ready index on Redis Streams with one consumer group (seed 003, 3.1).

Layout, under a prefix (default `tenure:`):

    <prefix>ready:<agent>:high     stream of hints for jobs of priority > 0   fields: job
    <prefix>ready:<agent>:normal   stream of hints for the other jobs         fields: job
    <prefix>ready:@<worker id>     stream of hints for jobs preferred to that worker (docs/routing.md): fields
                                   job, agent; read only by that worker, beside the agents' streams
    consumer group `workers` on each; the consumer name is the worker id

A job preferred to a worker is hinted on its agent's stream and on the worker's own: the agent's stream hands a
hint to one consumer, which may not claim the job during its grace, so the preferred worker is woken by its own
stream. A worker's stream lives while its worker reads it: its owner refreshes its expiry (`WORKER_STREAM_TTL_S`)
with the periodic hand-over of stale deliveries, each publish sets it too, and Redis collects the stream of a
worker that died one TTL after the last of either.

A worker reserves capacity, then `take`s: `XAUTOCLAIM` hands over deliveries idle longer than the claim TTL
(their consumer died between reading and acknowledging), then a non-blocking `XREADGROUP` of the high
streams, then a blocking `XREADGROUP` of all streams. It acknowledges (`XACK`) after the database claim
succeeded or proved the job gone. A missing group (`NOGROUP`: Redis restarted without persistence, or was
flushed) is recreated and `rebuild_needed` is set, so the caller re-publishes the store's queued jobs.
Driver errors surface as `StoreUnavailable`; the worker then polls the store, slower but correct.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from tenure.backends.redis._client import client_identity
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.ready import Delivery, ReadyHint, ReadyIndex

GROUP = "workers"
MAXLEN = 100_000
WORKER_MAXLEN = 1_000
WORKER_STREAM_TTL_S = 3600


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisReadyIndex:
    """See the module docstring. `stale_s` is how long a delivery may stay unacknowledged before another
    consumer takes it over (the claim TTL: by then a live claimer has acknowledged)."""

    def __init__(
        self,
        url: str,
        prefix: str = "tenure:",
        *,
        stale_s: float = 15.0,
        timeout_s: float = 5.0,
        max_block_s: float = 5.0,
    ) -> None:
        self._client = Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s + max_block_s,
            **client_identity(),
        )
        self._prefix = prefix
        self._stale_ms = max(1, int(stale_s * 1000))
        self._max_block_s = max_block_s
        self._groups: set[str] = set()
        self._next_autoclaim = 0.0
        self._closed = False
        self.rebuild_needed = False

    def stream(self, agent: str, high: bool) -> str:
        """The stream key of `agent`'s high or normal band."""
        return f"{self._prefix}ready:{agent}:{'high' if high else 'normal'}"

    def worker_stream(self, worker: str) -> str:
        """The stream key of the hints of jobs preferred to `worker`."""
        return f"{self._prefix}ready:@{worker}"

    async def _ensure_groups(self, streams: Sequence[str]) -> None:
        for s in streams:
            if s in self._groups:
                continue
            try:
                await self._client.xgroup_create(s, GROUP, id="0", mkstream=True)
                # A group created now did not exist (first start, or the index was lost): rebuild it. A worker's
                # own stream is new with each worker: its jobs are on their agents' streams too.
                if not s.startswith(f"{self._prefix}ready:@"):
                    self.rebuild_needed = True
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(s)

    async def publish(self, hints: Sequence[ReadyHint]) -> None:
        """XADD one entry per hint (approximately trimmed), in one pipelined round trip."""
        if not hints:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for h in hints:
                    pipe.xadd(self.stream(h.agent, h.priority > 0), {"job": h.job_id}, maxlen=MAXLEN, approximate=True)
                    if h.worker is not None:
                        own = self.worker_stream(h.worker)
                        pipe.xadd(own, {"job": h.job_id, "agent": h.agent}, maxlen=WORKER_MAXLEN, approximate=True)
                        pipe.expire(own, WORKER_STREAM_TTL_S)
                await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"ready index publish failed: {exc}") from exc

    async def take(self, consumer: str, agents: Sequence[str], count: int, block_s: float) -> list[Delivery]:
        if count <= 0:
            return []
        own = self.worker_stream(consumer)
        high = [own, *(self.stream(a, True) for a in agents)]
        normal = [self.stream(a, False) for a in agents]
        try:
            await self._ensure_groups(high + normal)
            out = await self._autoclaim(consumer, high + normal, count)
            if not out:
                out = await self._read(consumer, high, count, None)
            if not out:
                block_ms = max(1, int(min(block_s, self._max_block_s) * 1000))
                out = await self._read(consumer, high + normal, count, block_ms)
            return out
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                self._groups.clear()  # recreated (and a rebuild asked for) on the next take
                self.rebuild_needed = True
                return []
            raise StoreUnavailable(f"ready index read failed: {exc}") from exc
        except RedisError as exc:
            self._groups.clear()
            raise StoreUnavailable(f"ready index read failed: {exc}") from exc

    async def _autoclaim(self, consumer: str, streams: Sequence[str], count: int) -> list[Delivery]:
        # Stale deliveries are rare (a consumer died holding them): look every half TTL, not every read.
        now = time.monotonic()
        if now < self._next_autoclaim:
            return []
        self._next_autoclaim = now + self._stale_ms / 2000
        async with self._client.pipeline(transaction=False) as pipe:
            for s in streams:
                pipe.xautoclaim(s, GROUP, consumer, self._stale_ms, start_id="0-0", count=count)
            pipe.expire(self.worker_stream(consumer), WORKER_STREAM_TTL_S)  # its owner keeps its own stream alive
            answers = (await pipe.execute())[:-1]
        out: list[Delivery] = []
        for s, answer in zip(streams, answers, strict=True):
            for entry_id, fields in answer[1]:
                if fields:  # an entry trimmed away since its delivery has no fields
                    out.append(self._delivery(s, entry_id, fields))
        return out

    async def _read(self, consumer: str, streams: Sequence[str], count: int, block_ms: int | None) -> list[Delivery]:
        answer: Any = await self._client.xreadgroup(GROUP, consumer, {s: ">" for s in streams}, count=count, block=block_ms)
        out: list[Delivery] = []
        for stream, entries in answer or []:
            for entry_id, fields in entries:
                out.append(self._delivery(_text(stream), entry_id, fields))
        return out

    def _delivery(self, stream: str, entry_id: Any, fields: Any) -> Delivery:
        job = fields.get(b"job", fields.get("job", b""))
        agent = fields.get(b"agent", fields.get("agent"))  # a worker's own stream names the agent
        if agent is None:
            agent = stream[len(self._prefix) + len("ready:") :].rsplit(":", 1)[0]
        return Delivery(_text(job), _text(agent), stream, _text(entry_id))

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """XACK (and XDEL: a hint is worth nothing once acknowledged) in one pipelined round trip."""
        if not deliveries:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for d in deliveries:
                    pipe.xack(d.stream, GROUP, d.entry_id)
                    pipe.xdel(d.stream, d.entry_id)
                await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"ready index ack failed: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._client.aclose()
        except RedisError:
            pass


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[ReadyIndex] = RedisReadyIndex
