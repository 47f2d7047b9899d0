"""Admission's gate in the enqueue's own round trip on PostgreSQL (control/gate.py `Gate.ask`): `tenure_enqueue`
(migrations 0014, 0015) reads the admission state before it inserts and refuses past the thresholds it is given; the
gate's rule, on the state it read, gives the answer. Keyed and capped jobs read it inside their transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import asyncpg

from tenure.backends._queries import load_queries
from tenure.backends.postgres import _batches
from tenure.backends.postgres.audit import enqueue_with_budgets
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk
from tenure.contracts.types import NewJob

Q = load_queries("tenure.backends.postgres")

GATE_REFUSED = "TNGAT"
"""The SQLSTATE `tenure_enqueue` refuses with when the gate's read it was given passes a threshold."""


def refused(gate: GateAsk, exc: asyncpg.PostgresError) -> NoReturn:
    """The answer to an enqueue the gate refused in SQL: the gate's own rule, on the state the function read (in
    `exc`'s DETAIL). A rule that admits what the SQL refused is a defect, reported as one."""
    s = json.loads(exc.detail or "{}")
    gate.verdict(_admission_state(s["total"], s["mine"], s["failures"], s["latest"], s["now"], gate))
    raise AssertionError(f"the gate's rule admits what tenure_enqueue refused: {s}")


def _admission_state(
    total: int, mine: int, failures: int, latest: float | None, now: float, gate: GateAsk
) -> AdmissionState:
    circuit = CircuitState.from_window(failures, latest, now, gate.threshold, gate.open_s)
    return AdmissionState(int(total), int(mine), circuit)


async def check_gate(conn: asyncpg.Connection, gate: GateAsk) -> None:
    """The gate's read and rule inside the caller's transaction (the enqueue of keyed or capped jobs)."""
    r = await conn.fetchrow(Q["admission_state"], gate.tenant, gate.circuit_key, gate.window_s, gate.count_upto)
    gate.verdict(_admission_state(r["total"], r["mine"], r["failures"], r["latest"], r["now"], gate))


async def enqueue_gated(conn: asyncpg.Connection, jobs: Sequence[NewJob], gate: GateAsk | None) -> list[Any]:
    """The rows `enqueue_jobs` inserted for `jobs` (unkeyed, uncapped), after the gate's read when given."""
    try:
        return await enqueue_with_budgets(conn, Q["enqueue_jobs"], _batches.jobs(jobs) + _batches.gate(gate), jobs)
    except asyncpg.PostgresError as exc:
        if gate is None or exc.sqlstate != GATE_REFUSED:
            raise
        refused(gate, exc)
