"""The job path's writes on SQLite, each inside the caller's write transaction (on the connection thread): the
insert, the claim CAS, the start CAS and the finish CAS. Separate functions so that one transaction can run several of
them (`finish_and_claim`: the finishes, then a claim and its starts, in one commit)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from tenure.backends import _rows, _rules
from tenure.backends.sqlite import keys
from tenure.backends.sqlite._claims import claim_sql
from tenure.backends.sqlite._connection import Q
from tenure.contracts.types import Claim, Finish, NewJob, Start, Started, new_id, new_token


def changed(
    db: sqlite3.Connection, write: str, args: Sequence[Any], read: str, read_args: Sequence[Any]
) -> list[sqlite3.Row]:
    """Run `write`; if it changed any row, the rows `read` reads back (by key, in the same transaction): what a
    RETURNING clause would answer, without the ephemeral table SQLite gives each statement that has one
    (queries.sql's header). Empty when the write changed nothing."""
    if db.execute(write, args).rowcount == 0:
        return []
    return db.execute(read, read_args).fetchall()


def insert_in(db: sqlite3.Connection, j: NewJob, key_wait: bool) -> list[sqlite3.Row]:
    """Insert one job inside the caller's write transaction: the row as inserted (get_job's columns), or nothing
    when its (tenant, idempotency digest) existed. `key_wait`: its concurrency key has no free turn (keys.plan)."""
    return changed(db, Q["insert_job"], _rules.job_values(j, key_wait), Q["get_job"], (j.id, None))


def finish_in(db: sqlite3.Connection, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
    """The finish CAS of each execution, inside the caller's write transaction; appends the finishing event and
    the execution record (and counts a timeout in its agent's circuit). Returns the job ids whose finish matched."""
    done = []
    for x in finishes:
        f = x.fence
        matched = changed(
            db,
            Q["finish_execution"],
            (
                f.job_id,
                x.execution_id,
                f.epoch,
                f.token,
                x.state.value,
                x.result_json,
                x.error_code,
                x.error_message,
                x.retry_delay_s,
            ),
            Q["finished_job"],
            (f.job_id,),
        )
        if not matched:
            continue
        row = matched[0]
        effects = _rules.finish_effects(x)
        payload = _rules.finish_payload(x, row["next_attempt_at"])
        db.execute(Q["insert_event"], (f.job_id, f.epoch, x.seq, x.execution_id, effects.event_type, payload))
        db.execute(
            Q["insert_execution"],
            (x.execution_id, f.job_id, f.epoch, worker_id, x.started_at, effects.outcome, x.usage_json),
        )
        if effects.counts_in_circuit:
            db.execute(Q["circuit_record_job_timeout"], (f.job_id,))
        if row["passes_key"] is not None:  # its key's turn passes on, in this transaction
            keys.pass_turns(db, [(row["tenant"], row["passes_key"])])
        done.append(f.job_id)
    return done


def claim_and_start_in(
    db: sqlite3.Connection,
    worker_id: str,
    agents: Sequence[str],
    capabilities: Sequence[str],
    limit: int,
    ttl_s: float,
) -> list[tuple[Claim, Started]]:
    """The claim CAS and the start CAS of each job it claims, as one UPDATE (`claim_and_start`), inside the
    caller's write transaction; appends `execution.started` to each."""
    if limit <= 0:
        return []
    token = new_token()
    executions = json.dumps([new_id() for _ in range(limit)])
    args = (worker_id, json.dumps(list(agents)), json.dumps(list(capabilities)), limit, ttl_s, token, executions)
    out = []
    for r in changed(db, claim_sql("claim_and_start", len(agents)), args, Q["claimed_jobs"], (worker_id, token)):
        claim = _rows.claim(r, token, attempts=r["attempts"] - 1)  # the start added one attempt to the claim's
        f = claim.fence
        payload = json.dumps({"worker_id": worker_id, "attempt": r["attempts"]})
        db.execute(Q["insert_event"], (f.job_id, f.epoch, 1, r["execution_id"], "execution.started", payload))
        out.append((claim, _rows.started(r, f, r["execution_id"])))
    return out


def start_in(db: sqlite3.Connection, worker_id: str, starts: Sequence[Start]) -> list[Started]:
    """The start CAS of each claim, inside the caller's write transaction; appends `execution.started`."""
    out = []
    for s in starts:
        f = s.fence
        matched = changed(
            db, Q["start_execution"], (f.job_id, worker_id, f.epoch, f.token, s.execution_id), Q["started_job"], (f.job_id,)
        )
        if not matched:
            continue
        row = matched[0]
        payload = json.dumps({"worker_id": worker_id, "attempt": row["attempts"]})
        db.execute(Q["insert_event"], (f.job_id, f.epoch, 1, s.execution_id, "execution.started", payload))
        out.append(_rows.started(row, f, s.execution_id))
    return out
