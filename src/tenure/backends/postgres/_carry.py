"""A worker's pending finishes carried by its next claim on PostgreSQL (`PostgresStore.finish_and_claim`): the
finish CAS of the batch and the claim and start CAS in one statement, one round trip and one commit, on the claim
connection. Without it a draining worker spends a round trip on each (a py-spy of a no-op drain: the socket writes
of the two were 37% of the worker's samples; bench/README.md, session 14).

The finish statement (queries.sql `finish_executions`) cannot sit in another statement's WITH (its CTEs modify
data), so each claim connection creates it as a session-local function, `pg_temp.tenure_finish`, whose body is that
statement verbatim; the statement run here is `claim_and_start` with one CTE more that calls it, and one column
more that carries the finish's rows as JSON (on one row even when the claim finds nothing). Both are derived from
the texts they combine, so the finish and the claim stay written once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import asyncpg

from tenure.backends import _rows
from tenure.backends.postgres import _batches, keys
from tenure.contracts.ids import new_ids, new_token
from tenure.contracts.types import Claim, Finish, Started

# The types of finish_executions' $1..$16, in order (the columns of _batches.finishes, then the worker id).
_FINISH_TYPES = (
    "uuid[] int4[] int8[] uuid[] text[] text[] text[] text[] float8[] int4[] float8[] text[] text[] text[] bool[]".split()
)
_CLAIM_PARAMS = 7  # claim_and_start's $1..$7: worker, agents, capabilities, limit, ttl, token, execution ids


def finish_function(finish_sql: str) -> str:
    """`CREATE FUNCTION pg_temp.tenure_finish(...)`: the finish statement `finish_sql` as a session-local function
    of the same parameters, answering its rows (id, woke, tenant, passes_key)."""
    return (
        f"CREATE OR REPLACE FUNCTION pg_temp.tenure_finish({', '.join(_FINISH_TYPES)}, text)\n"
        "RETURNS TABLE (o_id text, o_woke bigint, o_tenant text, o_passes_key text)\n"
        "LANGUAGE plpgsql AS $fn$\nBEGIN\n    RETURN QUERY\n" + finish_sql + ";\nEND\n$fn$"
    )


def finish_and_claim_sql(claim_sql: str) -> str:
    """`claim_sql` (claim_and_start: `WITH s AS (...), ... SELECT ... FROM s`) with the finish first: its
    parameters follow the claim's ($8 on; the worker id is the claim's $1), its rows as a JSON column."""
    lines = claim_sql.splitlines()
    while lines and lines[0].startswith("--"):  # its description
        lines.pop(0)
    head, _, tail = "\n".join(lines).rpartition("\nSELECT ")
    columns, _, source = tail.rpartition("\n")
    if not head.startswith("WITH ") or source.strip() != "FROM s":
        raise ValueError("claim_and_start is not `WITH ... SELECT ... FROM s`: finish_and_claim cannot extend it")
    args = [f"${_CLAIM_PARAMS + 1 + i}::{t}" for i, t in enumerate(_FINISH_TYPES)]
    return (
        f"WITH fin AS MATERIALIZED (SELECT * FROM pg_temp.tenure_finish({', '.join(args)}, $1::text)),\n"
        + head.removeprefix("WITH ")
        + "\nSELECT "
        + columns
        + ",\n       (SELECT json_agg(fin)::text FROM fin) AS finished\n  FROM (SELECT 1) AS one LEFT JOIN s ON true"
    )


async def finish_and_claim(
    conn: asyncpg.Connection,
    sql: str,
    worker_id: str,
    finishes: Sequence[Finish],
    agents: Sequence[str],
    capabilities: Sequence[str],
    limit: int,
    ttl_s: float,
) -> tuple[list[str], list[tuple[Claim, Started]]]:
    """Run `sql` (`finish_and_claim_sql`) on the claim connection `conn`; then pass on the turns of the keys whose
    jobs ended (as `PostgresStore.finish` does: a crash before that, and the sweeper passes them)."""
    token = new_token()
    rows = await conn.fetch(
        sql, worker_id, list(agents), list(capabilities), limit, ttl_s, token, new_ids(limit),
        *_batches.finishes(finishes),
    )  # fmt: skip
    finished = json.loads(rows[0]["finished"] or "[]") if rows else []
    ended = [(f["o_tenant"], f["o_passes_key"]) for f in finished if f["o_passes_key"] is not None]
    if ended:
        await keys.pass_turns(conn, ended)
    return [f["o_id"] for f in finished], [_rows.claim_started(r, token) for r in rows if r["id"] is not None]
