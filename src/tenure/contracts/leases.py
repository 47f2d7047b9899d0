"""The `Leases` protocol: named, heartbeated, per-holder slots (quotas, the sweeper duty), and the names of a
key's waiting line. One of the store's three protocols (`contracts/store.py`, which re-exports it with the others);
the SQL stores implement it on a `leases` table with the database clock, Redis with a ZSET and Lua on Redis's own
`TIME`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tenure.contracts.types import new_id


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """One held slot of a named limit: the key, and the holder (an execution id plus a slot index)."""

    key: str
    holder: str


@dataclass(frozen=True, slots=True)
class InLine:
    """What `Leases.acquire_in_line` answers: whether the ticket's holder holds a slot now, and otherwise the
    older tickets this call handed free slots to (tell their waiters, as after a release)."""

    held: bool
    served: tuple[str, ...] = ()


WAIT_SUFFIX = "#wait"
"""The waiting line of lease key `k` is the lease key `k#wait` (quota keys cannot contain `#`): its holders are
tickets, renewed and expired like any lease, so a waiter that dies leaves the line on its own."""


def line_key(key: str) -> str:
    """The lease key of the waiting line of `key`."""
    return key + WAIT_SUFFIX


def new_ticket(holder: str) -> str:
    """A place in a waiting line for `holder`: `<order>/<holder>`, where `<order>` is 32 lowercase hex digits
    of a time-ordered id, so tickets sort by the moment they were made (byte order, in every backend) and a
    hand-over knows whom to give the slot to."""
    return f"{new_id().replace('-', '')}/{holder}"


def ticket_holder(ticket: str) -> str:
    """The holder a ticket queues for."""
    return ticket.partition("/")[2]


@runtime_checkable
class Leases(Protocol):
    """Named, per-holder, heartbeated slots. Acquire is idempotent for one holder; release is harmless twice.

    A key's slots can also be taken in FIFO order through its waiting line (`line_key(key)`): callers that
    find the key full queue a ticket with `acquire_in_line`, and `release_and_hand_over` gives a freed slot to
    the oldest ticket in the same atomic step, so a slot is never idle on the server while someone waits."""

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        """Take one of `limit` slots of `key` for `holder` until now + ttl (server clock). False if full."""
        ...

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        """Extend every held lease in one round trip. Returns the ones that were no longer held (lost)."""
        ...

    async def release(self, key: str, holder: str) -> None:
        """Give the slot back. Releasing a slot not held does nothing."""
        ...

    async def holders(self, key: str) -> list[str]:
        """Current unexpired holders of `key`."""
        ...

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
        """Take a slot of `key` for `ticket_holder(ticket)` in FIFO order, or wait in line for one.

        The holder takes a slot when it already holds one (refreshed: a hand-over may have granted it), or when
        fewer unexpired tickets older than `ticket` wait in `key`'s line than there are free slots; its ticket
        then leaves the line and the answer is `held`. Otherwise the ticket joins the line (or stays, renewed to
        now + ttl), and the free slots it may not take — slots that came free by expiry, which no release hands
        over — go to the oldest tickets as `release_and_hand_over` gives them: the answer lists them in
        `served`. One atomic step, server clock."""
        ...

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Give `holder`'s slot back (harmless when not held) and, in the same atomic step, hand every free slot
        of `key` to the oldest unexpired tickets of its line: each ticket's holder holds a slot until now + ttl
        and the ticket leaves the line. Returns the tickets served, oldest first (tell their waiters)."""
        ...

    async def close(self) -> None:
        """Release what this instance owns (leases on a store's own connections own nothing). Idempotent."""
        ...
