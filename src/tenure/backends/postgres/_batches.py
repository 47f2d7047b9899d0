"""Batches as PostgreSQL's batched statements take them: parallel arrays, one per column, that the statement
`unnest`s (one round trip for any number of rows), in job id order.

The order is the point: every multi-row write locks its rows in the same order, so two of them (a batch of
finishes and a heartbeat, say) never deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tenure.backends import _rules
from tenure.contracts.reports import GateAsk
from tenure.contracts.types import Fence, Finish, NewEvent, NewJob, Start


def columns(rows: Iterable[Sequence[Any]], width: int) -> list[list[Any]]:
    """Parallel arrays (one per column) of `rows`, each `width` values long."""
    cols: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for i, v in enumerate(row):
            cols[i].append(v)
    return cols


def fences(fences: Iterable[Fence]) -> tuple[list[str], list[int], list[int]]:
    """Job ids, epochs and tokens, in job id order."""
    ids, epochs, tokens = [], [], []
    for f in sorted(fences, key=lambda f: f.job_id):
        ids.append(f.job_id)
        epochs.append(f.epoch)
        tokens.append(f.token)
    return ids, epochs, tokens


def starts(starts: Sequence[Start]) -> tuple[list[str], list[int], list[int], list[str]]:
    """`fences` of the starts, and their execution ids in the same order."""
    ordered = sorted(starts, key=lambda s: s.fence.job_id)
    return (*fences(s.fence for s in ordered), [s.execution_id for s in ordered])


def jobs(jobs: Sequence[NewJob], key_wait: bool = False) -> list[list[Any]]:
    """The columns of `enqueue_jobs` (inserts take no row locks: admission order is kept). `key_wait`: keyed
    jobs wait for their key's turn (decided by `_rules.key_plan` under the key's lock, one job at a time)."""
    return columns((_rules.job_values(j, key_wait) for j in jobs), 24)


def gate(ask: GateAsk | None) -> list[Any]:
    """The gate's parameters of `enqueue_jobs` ($25..$31): the read `ask` hands to the enqueue, or NULLs."""
    if ask is None:
        return [None] * 7
    return [ask.tenant, ask.circuit_key, ask.window_s, ask.threshold, ask.open_s, ask.total_max, ask.tenant_max]


def finishes(finishes: Sequence[Finish]) -> list[list[Any]]:
    """The columns of `finish_executions`, with what `_rules.finish_effects` decides for each finish."""
    rows = []
    for f in sorted(finishes, key=lambda f: f.fence.job_id):
        effects = _rules.finish_effects(f)
        rows.append(
            (
                f.fence.job_id,
                f.fence.epoch,
                f.fence.token,
                f.execution_id,
                f.state.value,
                f.result_json,
                f.error_code,
                f.error_message,
                f.retry_delay_s,
                f.seq,
                f.started_at,
                f.usage_json,
                effects.event_type,
                effects.outcome,
                effects.counts_in_circuit,
            )
        )
    return columns(rows, 15)


def events(events: Sequence[NewEvent]) -> list[list[Any]]:
    """The columns of `append_events` (its FOR SHARE takes the job rows in id order itself)."""
    return columns(
        ((e.fence.job_id, e.fence.epoch, e.fence.token, e.seq, e.execution_id, e.type, e.payload_json) for e in events),
        7,
    )
