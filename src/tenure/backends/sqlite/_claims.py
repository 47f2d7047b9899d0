"""The claim statements of one worker on SQLite (queries.sql `claim_candidates`, docs/durable-jobs.md).

A claim's candidates are the head of a ready index. A worker that serves up to `PER_AGENT_MAX` agents reads the
head of `jobs_ready_agent (agent, priority DESC, fair_at, id)` for each of them and merges those heads in claim
order, so a backlog of an agent it does not serve is never read (bench/backlog.py: behind 100,000 jobs of another
agent the claim costs what it costs behind none). A worker of more agents reads the head of `jobs_ready`, where
the agent is a filter on the rows it walks. Both indexes share the claimable predicate and the order, so the key
rule and the fair shares hold for either.
"""

from __future__ import annotations

import functools

from tenure.backends.sqlite._connection import Q

PER_AGENT_MAX = 16
"""The most agents whose heads a claim reads one by one; a worker of more reads the head of jobs_ready."""

_ORDER = "ORDER BY priority DESC, fair_at, id"


def _fragment() -> str:
    body = Q["claim_candidates"]
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))


@functools.cache
def candidates(agents: int) -> str:
    """The candidates of a claim by a worker of `agents` agents (bound as the JSON array ?2)."""
    fragment = _fragment()
    if agents > PER_AGENT_MAX or agents < 1:
        return fragment.replace("{index}", "jobs_ready").replace("{agent}", "agent IN (SELECT value FROM json_each(?2))")
    heads = [
        "SELECT * FROM ("
        + fragment.replace("{index}", "jobs_ready_agent").replace("{agent}", f"agent = json_extract(?2, '$[{i}]')")
        + ")"
        for i in range(agents)
    ]
    if agents == 1:
        return heads[0]
    return "SELECT id, priority, fair_at FROM (" + " UNION ALL ".join(heads) + f") {_ORDER} LIMIT ?4"


@functools.cache
def claim_sql(name: str, agents: int) -> str:
    """`claim_jobs`, `claim_and_start` or `claim_probe` for a worker of `agents` agents."""
    return Q[name].replace("{candidates}", candidates(agents))
