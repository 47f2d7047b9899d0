"""Which index serves a list or a count of jobs in one state, on SQLite (migrations/0010_state_pages.sql).

No index holds every job's state: one that did moved each job at every transition, a quarter of a no-op drain's
throughput. A state filter reads instead the partial index of its kind, each written only while a job is of that
kind. A query that filters on a state carries `{state_index}`, `{state_tenant_index}` and `{state_served}`
(the index's condition, which the query must repeat for SQLite to use a partial index); `per_state` fills them
in for every state, and the pin (INDEXED BY) keeps a planner without statistics from walking the primary key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tenure.contracts.states import TERMINAL, JobState

_WAITING = ("state IN ('queued', 'scheduled')", "jobs_waiting_state", "jobs_waiting_tenant")
_DONE = ("finished_at IS NOT NULL", "jobs_done_state", "jobs_done_tenant_state")

STATE_PAGES: Mapping[JobState, tuple[str, str, str]] = {
    JobState.QUEUED: _WAITING,
    JobState.SCHEDULED: _WAITING,
    JobState.RUNNING: ("owner IS NOT NULL", "jobs_owned", "jobs_owned"),  # as many as the fleet has slots
    JobState.WAITING: ("state = 'waiting'", "jobs_paused_state", "jobs_paused_tenant_state"),
    **{s: _DONE for s in TERMINAL},
}
"""Per state: (the partial index's condition, the index, the index with the tenant first)."""


def per_state(queries: Mapping[str, str], names: Iterable[str]) -> dict[tuple[str, JobState], str]:
    """Each of `names`, filled in for each state."""
    out: dict[tuple[str, JobState], str] = {}
    for name in names:
        for state, (served, index, tenant_index) in STATE_PAGES.items():
            sql = queries[name].replace("{state_served}", served)
            out[name, state] = sql.replace("{state_index}", index).replace("{state_tenant_index}", tenant_index)
    return out
