"""`RedisChannel`: the `Channel` protocol on Redis pub/sub (fire-and-forget, the accelerator only).

Messages published while a subscriber is disconnected are lost: every user keeps a slower path (polling,
heartbeat flags, history). Driver errors surface as `LeasesUnavailable` (a `StoreUnavailable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tenure.backends.redis._client import client_identity
from tenure.contracts.channel import Channel
from tenure.contracts.errors import LeasesUnavailable

DEFAULT_PREFIX = "tenure:chan:"


class RedisChannel:
    """Publish and subscribe on one Redis server; topics are channel names under `prefix`."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *, timeout_s: float = 5.0) -> None:
        self._prefix = prefix
        self._client = Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            **client_identity(),
        )
        # Subscriptions block on reads for as long as nothing is published: no socket timeout there.
        self._sub_client = Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            **client_identity(),
        )
        self._closed = False

    async def publish(self, topic: str, message: str) -> None:
        """Send `message` to the current subscribers of `topic`."""
        try:
            await self._client.publish(self._prefix + topic, message)
        except RedisError as exc:
            raise LeasesUnavailable(f"Redis publish on {topic} failed: {exc}") from exc

    async def subscribe(
        self, topics: Sequence[str], on_subscribed: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        """Yield `(topic, message)` until the connection is lost (then `LeasesUnavailable`)."""
        pubsub = self._sub_client.pubsub()
        unconfirmed = {self._prefix + t for t in topics}
        try:
            await pubsub.subscribe(*unconfirmed)
            while True:
                # Not `pubsub.listen()`: when the kernel ends the socket with ETIMEDOUT (a partition that
                # outlasted TCP keepalive), Python raises TimeoutError, which is asyncio.TimeoutError, and redis-py
                # takes it for "no message yet" and answers None at once, forever; listen() then loops without
                # yielding and blocks the event loop for good. A blocking read answers None only then.
                item = await pubsub.get_message(timeout=None)
                if item is None:
                    raise LeasesUnavailable("Redis subscription lost: its connection failed (timed out)")
                if item.get("type") == "subscribe" and unconfirmed:
                    channel = item["channel"]
                    unconfirmed.discard(channel.decode() if isinstance(channel, bytes) else str(channel))
                    if not unconfirmed and on_subscribed is not None:
                        on_subscribed()
                    continue
                if item.get("type") != "message":
                    continue
                channel = item["channel"]
                data = item["data"]
                name = channel.decode() if isinstance(channel, bytes) else str(channel)
                text = data.decode() if isinstance(data, bytes) else str(data)
                yield name.removeprefix(self._prefix), text
        except RedisError as exc:
            raise LeasesUnavailable(f"Redis subscription lost: {exc}") from exc
        finally:
            # Bounded: this runs on cancellation too; a half-read subscription must not hang the canceller.
            try:
                async with asyncio.timeout(2):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            except (RedisError, TimeoutError):
                pass

    async def close(self) -> None:
        """Close both connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for client in (self._client, self._sub_client):
            try:
                await client.aclose()
            except RedisError:
                pass


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Channel] = RedisChannel
