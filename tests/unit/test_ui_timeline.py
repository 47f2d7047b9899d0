"""The job page's audit timeline without I/O (gateway/ui/timeline.py): records under their execution, edits after
the epoch they followed, step states as the page names them, the budget's rows, previews of long values."""

from __future__ import annotations

from typing import Any

from tenure.contracts.audit import BudgetUse
from tenure.gateway.ui.timeline import FULL, audit_timeline, budget_rows, clip, number, record_url


def execution(n: int, outcome: str) -> dict[str, Any]:
    return {"id": f"x{n}", "epoch": n, "worker_id": f"w{n}", "outcome": outcome, "usage": None, "attempt": n}


def audit(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": "j1",
        "executions": [execution(1, "failed"), execution(2, "lost"), execution(3, "running")],
        "tool_calls": [],
        "evidence": [],
        "usage": [],
        "edits": [],
        "steps": [],
        "usage_totals": {},
        "next_cursor": None,
    }
    return base | kw


def step(key: str, state: str, execution_id: str) -> dict[str, Any]:
    return {"key": key, "state": state, "epoch": 1, "execution_id": execution_id, "started_at": 1.0, "ended_at": None}


def test_records_go_under_their_execution_in_epoch_and_seq_order_and_edits_after_their_epoch() -> None:
    t = audit_timeline(
        audit(
            tool_calls=[
                {"epoch": 2, "seq": 2, "execution_id": "x2", "kind": "tool_call", "name": "b", "error": "E: x"},
                {"epoch": 1, "seq": 1, "execution_id": "x1", "kind": "tool_call", "name": "a", "result": 1},
            ],
            evidence=[{"epoch": 2, "seq": 1, "execution_id": "x2", "kind": "evidence", "evidence_kind": "k", "content": 2}],
            usage=[{"epoch": 9, "seq": 1, "execution_id": "x9", "kind": "usage", "model": None, "counts": {"tokens": 1}}],
            edits=[{"epoch": 2, "seq": 3, "execution_id": None, "kind": "requeue", "previous_input": 1, "input": 2}],
        ),
        None,
        paged=False,
    )
    x1, x2, x3 = t["executions"]
    assert [r["key"] for r in x1["records"]] == ["1.1"] and not x1["records"][0]["failed"]
    assert [(r["kind"], r["key"]) for r in x2["records"]] == [("evidence", "2.1"), ("tool_call", "2.2")]
    assert x2["records"][1]["error"] == "E: x"
    assert [(e["previous"]["preview"], e["input"]["preview"]) for e in x2["edits"]] == [("1", "2")]
    assert x3["empty"] and not x3["records"]
    assert [r["key"] for r in t["orphans"]] == ["9.1"]  # an execution the list does not hold: shown apart
    assert x1["retried"] and not x2["retried"]  # failed, and another attempt followed


def test_steps_are_done_resolved_unknown_or_running() -> None:
    steps = [step("a", "done", "x1"), step("b", "resolved", "x2"), step("c", "started", "x2"), step("d", "started", "x3")]
    t = audit_timeline(audit(steps=steps), None, paged=False)
    states = {s["key"]: s["state"] for e in t["executions"] for s in e["steps"]}
    # Begun and never ended by an execution that no longer runs: unknown. By the running one: running.
    assert states == {"a": "done", "b": "resolved", "c": "unknown", "d": "running"}


def test_a_paged_audit_says_where_an_executions_records_are() -> None:
    records = [{"epoch": 2, "seq": 1, "execution_id": "x2", "kind": "evidence", "evidence_kind": "k", "content": 0}]
    t = audit_timeline(audit(evidence=records, next_cursor="2.1"), None, paged=True)
    assert [e["elsewhere"] for e in t["executions"]] == ["earlier", "", "later"]


def test_budget_rows_and_numbers() -> None:
    rows = budget_rows(BudgetUse({"tool_calls": 5, "cost": 0.5}, {"tool_calls": 5, "cost": 0.125}))
    assert [(r["limit"], r["used"], r["left"], r["exhausted"], r["percent"]) for r in rows] == [
        ("tool_calls", "5", "0", True, 100),
        ("cost", "0.125", "0.375", False, 25),
    ]
    assert budget_rows(None) == []
    assert [number(v) for v in (1234567, 0.00066, 2.0, None, True)] == ["1,234,567", "0.00066", "2", "-", "True"]


def test_a_long_value_is_previewed_and_kept_whole() -> None:
    short, long = clip({"a": 1}), clip({"text": "y" * 500})
    assert short == {"preview": '{"a": 1}', "full": '{\n  "a": 1\n}', "cut": False, "size": 8, "held": True}
    assert long["cut"] and len(long["preview"]) == 160 and long["preview"].endswith("…")
    assert long["full"].count("y") == 500 and long["held"]
    huge = clip({"text": "z" * (FULL + 10)})  # more than a page holds: cut, and linked to its record in the API
    assert not huge["held"] and huge["full"].count("z") < FULL
    assert record_url("j1", 3, 7) == "/v1/jobs/j1/audit?cursor=3.6&limit=1"
    assert record_url("j1", 3, 0) == "/v1/jobs/j1/audit?cursor=2.9999999999&limit=1"


def test_the_live_execution_of_a_waiting_job_is_shown_waiting() -> None:
    t = audit_timeline(audit(state="waiting"), None, paged=False)
    assert [e["outcome"] for e in t["executions"]] == ["failed", "lost", "waiting"]
