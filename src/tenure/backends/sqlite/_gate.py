"""Admission's gate on SQLite (control/gate.py `Gate.ask`): the admission state, read on the connection thread,
inside the enqueue's write transaction (whose lock makes the read and the inserts one step) or on its own."""

from __future__ import annotations

import sqlite3

from tenure.backends.sqlite._connection import Q
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk


def admission_state_in(
    db: sqlite3.Connection,
    tenant: str,
    circuit_key: str,
    threshold: int,
    window_s: float,
    open_s: float,
    upto: int | None = None,
) -> AdmissionState:
    """Jobs waiting to start (all, and of `tenant`, each counted up to `upto` when given) and the circuit
    `circuit_key`, on the store's clock."""
    row = db.execute(Q["admission_state"], (tenant, circuit_key, window_s, -1 if upto is None else upto)).fetchone()
    circuit = CircuitState.from_window(row["failures"], row["latest"], row["now"], threshold, open_s)
    return AdmissionState(int(row["total"]), int(row["mine"]), circuit)


def check_gate(db: sqlite3.Connection, gate: GateAsk) -> None:
    """The gate's read and rule inside the caller's write transaction: raises to refuse."""
    gate.verdict(
        admission_state_in(db, gate.tenant, gate.circuit_key, gate.threshold, gate.window_s, gate.open_s, gate.count_upto)
    )
