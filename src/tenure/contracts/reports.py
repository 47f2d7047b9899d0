"""What the store reports about its own state, beside the jobs it holds: why a queued job waits
(`JobStore.waiting_info`, docs/scheduling.md) and what holds the store back (`JobStore.health`,
docs/operations.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WaitingInfo:
    """Why a queued job waits (`JobStore.waiting_info`): claimable jobs ahead of it in claim order (counted up to a
    bound: `ahead_capped`), and for a job waiting for its concurrency key's turn the jobs holding the key."""

    ahead: int
    ahead_capped: bool
    key_holders: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What holds a store back, for metrics and `tenure doctor` (docs/operations.md).

    `oldest_xmin_age_s`: on PostgreSQL, the age of the oldest transaction (or snapshot, prepared transaction,
    replication slot) that keeps VACUUM from removing dead rows — the "xmin horizon"; while it stays old, every
    claim and finish leaves dead versions of `jobs` rows behind that nothing can reclaim. None where the store has
    no such thing (SQLite). `oldest_xmin_holder` says who holds it. Per table: dead rows (`dead_tuples`, PostgreSQL's
    estimate), live rows and bytes on disk with indexes (`table_bytes`; on SQLite, the whole file as `(file)`)."""

    oldest_xmin_age_s: float | None
    oldest_xmin_holder: str | None
    dead_tuples: Mapping[str, int]
    live_tuples: Mapping[str, int]
    table_bytes: Mapping[str, int]
