"""The live `Channel`: fire-and-forget messages between processes (Redis pub/sub), the accelerator beside the
durable truth. A message may be lost (a subscriber reconnecting, the server restarting); every user of a
channel keeps a slower path that does not depend on it (polling, the heartbeat's cancel flags, history
replay). Seed 000: events and pub/sub make things fast, shared state makes them right.

Topics used by Tenure:
    quota:<key>        a slot of quota <key> was released: wake the oldest waiter (docs/quotas.md)
    events             job ids whose history grew (the gateway's event streams; backends/signals.py)
    control            job ids that got a cancel request or a command (their owners; backends/signals.py)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Channel(Protocol):
    """Publish short text messages on topics and receive those of the topics subscribed to."""

    async def publish(self, topic: str, message: str) -> None:
        """Send `message` to the current subscribers of `topic` (none: it is dropped). Raises
        `LeasesUnavailable`-like `StoreUnavailable` subclasses only from the backend edge."""
        ...

    def subscribe(
        self, topics: Sequence[str], on_subscribed: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        """Yield `(topic, message)` for every message published on `topics` after the subscription is in
        place; `on_subscribed` is called once the server confirmed every topic (from then on nothing published
        is missed). The iterator ends (raising `StoreUnavailable`) when the connection is lost; resubscribe."""
        ...

    async def close(self) -> None:
        """Close connections. Idempotent."""
        ...
