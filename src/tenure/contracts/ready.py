"""The `ReadyIndex`: which queued jobs may be claimable, kept outside the database to wake workers quickly.

The index is an accelerator, never the truth (seed 000, second layer; seed 003, 3.1): the claim is always
the conditional UPDATE in the store, a hint may be stale or duplicated, and a lost index (a restarted or
flushed Redis) is rebuilt from the database while workers fall back to polling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ReadyHint:
    """A job that may be claimable now: its id, its agent (one stream per agent) and its priority band."""

    job_id: str
    agent: str
    priority: int = 0
    worker: str | None = None
    """The job's preferred worker (docs/routing.md), woken directly: a hint of the agent's stream reaches one
    consumer, and that one may not claim the job during its grace."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One hint handed to one consumer; it stays pending until acknowledged (or taken over when stale)."""

    job_id: str
    agent: str
    stream: str
    entry_id: str


@runtime_checkable
class ReadyIndex(Protocol):
    """Hints of claimable jobs, delivered to one consumer at a time, acknowledged after the database claim."""

    rebuild_needed: bool
    """True when the index was found lost (or new): the caller re-publishes the queued jobs of the store."""

    async def publish(self, hints: Sequence[ReadyHint]) -> None:
        """Add hints (a job enqueued, released, or due again)."""
        ...

    async def take(self, consumer: str, agents: Sequence[str], count: int, block_s: float) -> list[Delivery]:
        """Up to about `count` deliveries for `agents`: stale deliveries of dead consumers first, then the
        high-priority band, then the normal one (waiting up to `block_s` for new hints). Call it only with
        `count` free execution slots reserved: a delivery taken without capacity would sit pending."""
        ...

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge deliveries whose database claim succeeded or proved the job gone."""
        ...

    async def close(self) -> None:
        """Close connections. Idempotent."""
        ...
