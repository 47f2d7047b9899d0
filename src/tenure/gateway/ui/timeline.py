"""The audit timeline of the job page, computed from the audit read model (`control/audit.py`, the body of
`GET /v1/jobs/{id}/audit`) and the job's budget: no I/O, no request.

    executions     every attempt in order, each with its records of this page in (epoch, seq) order (tool
                   calls, evidence, usage), its journal steps, and the input edits that followed it
    totals         the usage counters summed over every execution (not only this page)
    budget         each limit of the job's budget with what its executions used of it
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from tenure.contracts.audit import BudgetUse

PREVIEW = 160
"""Characters of a value shown inline; the whole value is behind a disclosure (`<details>`)."""
FULL = 20_000
"""Characters of a value the page holds at most (a page shows up to 200 records); a longer one links to its
record in `GET /v1/jobs/{id}/audit`."""

LIMIT_UNITS = (("tool_calls", "tool calls"), ("tokens", "tokens"), ("cost", "USD"), ("wall_s", "s"))


def clip(value: Any, n: int = PREVIEW) -> dict[str, Any]:
    """A JSON value for the page: a one-line preview of at most `n` characters, the whole value pretty-printed,
    and whether the preview cut it."""
    line = json.dumps(value, ensure_ascii=False, sort_keys=True)
    full = json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)
    if len(line) <= n:
        return {"preview": line, "full": full, "cut": False, "size": len(line), "held": True}
    held = len(full) <= FULL
    return {
        "preview": line[: n - 1] + "…",
        "full": full if held else full[:FULL] + "\n…",
        "cut": True,
        "size": len(line),
        "held": held,
    }


def record_url(job_id: str, epoch: int, seq: int) -> str:
    """The API's page of one audit record: its cursor is the position just before it (cursors are exclusive)."""
    before = f"{epoch}.{seq - 1}" if seq > 0 else f"{max(0, epoch - 1)}.9999999999"
    return f"/v1/jobs/{job_id}/audit?cursor={before}&limit=1"


def number(value: Any) -> str:
    """A counter as text: integers with thousands separators, other numbers with up to 6 significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.6g}"


def _step_state(step: Mapping[str, Any], running: set[str]) -> str:
    if step["state"] == "started":
        # Begun and never ended: its effect is unknown, unless the execution that began it still runs.
        return "running" if step["execution_id"] in running else "unknown"
    return str(step["state"])


def _item(job_id: str, r: Mapping[str, Any]) -> dict[str, Any]:
    kind = r["kind"]
    item: dict[str, Any] = {"kind": kind, "key": f"{r['epoch']}.{r['seq']}", "ts": r.get("ts")}
    item["url"] = record_url(job_id, r["epoch"], r["seq"])
    if kind == "tool_call":
        item.update(name=r.get("name"), arguments=clip(r.get("arguments")), duration=r.get("duration_s"))
        if "error" in r:
            item.update(failed=True, error=str(r["error"]))
        else:
            item.update(failed=False, result=clip(r.get("result")))
    elif kind == "evidence":
        item.update(name=r.get("evidence_kind"), content=clip(r.get("content")))
    elif kind == "usage":
        raw = r.get("counts")
        counts: dict[str, Any] = raw if isinstance(raw, dict) else {}
        tokens = [counts.get("input_tokens"), counts.get("output_tokens")]
        item.update(
            model=r.get("model"),
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            tokens=sum(t for t in tokens if isinstance(t, int | float)),
            cost=counts.get("cost_usd"),
            other={k: v for k, v in counts.items() if k not in ("input_tokens", "output_tokens", "cost_usd")},
        )
    else:
        item.update(data=clip(r))
    return item


def _edit(job_id: str, r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "key": f"{r['epoch']}.{r['seq']}",
        "url": record_url(job_id, r["epoch"], r["seq"]),
        "ts": r.get("ts"),
        "previous": clip(r.get("previous_input")),
        "input": clip(r.get("input")),
    }


def audit_timeline(audit: Mapping[str, Any], budget: BudgetUse | None, paged: bool) -> dict[str, Any]:
    """The timeline of one page of a job's audit (`paged`: this page is not the first one)."""
    job_id = str(audit["job_id"])
    executions = [dict(e) for e in audit["executions"]]
    by_id = {e["id"]: e for e in executions}
    by_epoch = {e["epoch"]: e for e in executions}
    running = {e["id"] for e in executions if e.get("outcome") == "running"}
    for e in executions:
        e.update(records=[], steps=[], edits=[])
        if e.get("outcome") == "running" and audit.get("state") == "waiting":
            e["outcome"] = "waiting"  # the read model says "running" for the live execution; the job waits
    orphans: list[dict[str, Any]] = []
    records = sorted([*audit["tool_calls"], *audit["evidence"], *audit["usage"]], key=lambda r: (r["epoch"], r["seq"]))
    for r in records:
        owner = by_id.get(r.get("execution_id"))
        (owner["records"] if owner is not None else orphans).append(_item(job_id, r))
    edits_before: list[dict[str, Any]] = []
    for r in audit["edits"]:
        owner = by_epoch.get(r["epoch"])
        (owner["edits"] if owner is not None else edits_before).append(_edit(job_id, r))
    loose_steps: list[dict[str, Any]] = []
    for s in audit["steps"]:
        step = {
            "key": s["key"],
            "state": _step_state(s, running),
            "epoch": s["epoch"],
            "started_at": s.get("started_at"),
            "ended_at": s.get("ended_at"),
            "result": clip(s.get("result")) if s["state"] != "started" else None,
        }
        owner = by_id.get(s["execution_id"])
        (owner["steps"] if owner is not None else loose_steps).append(step)
    first = (records[0]["epoch"] if records else None) if paged else None
    last = records[-1]["epoch"] if records and audit["next_cursor"] else None
    for n, e in enumerate(executions):
        e["retried"] = e.get("outcome") == "failed" and n + 1 < len(executions)
        earlier, later = first is not None and e["epoch"] < first, last is not None and e["epoch"] > last
        e["elsewhere"] = "earlier" if earlier else "later" if later else ""
        usage = e.get("usage") if isinstance(e.get("usage"), dict) else {}
        e["usage_text"] = ", ".join(f"{k} {number(v)}" for k, v in sorted(usage.items())) if usage else ""
        e["empty"] = not (e["records"] or e["steps"] or e["edits"])
    return {
        "job_id": job_id,
        "executions": executions,
        "orphans": orphans,
        "edits_before": edits_before,
        "loose_steps": loose_steps,
        "count": len(records) + len(audit["edits"]),
        "totals": [(k, number(v)) for k, v in sorted(audit["usage_totals"].items())],
        "budget": budget_rows(budget),
        "next_cursor": audit["next_cursor"],
        "paged": paged,
    }


def budget_rows(budget: BudgetUse | None) -> list[dict[str, Any]]:
    """Each limit of a job's budget: allowed, used so far (`wall_s`: ended executions only), left, exhausted."""
    if budget is None:
        return []
    rows = []
    for name, allowed in budget.limits.items():
        used = float(budget.used.get(name, 0.0))
        rows.append(
            {
                "limit": name,
                "unit": dict(LIMIT_UNITS).get(name, ""),
                "allowed": number(allowed),
                "used": number(round(used, 6)),
                "left": number(round(max(0.0, allowed - used), 6)),
                "exhausted": used >= allowed,
                "percent": min(100, round(100 * used / allowed)) if allowed > 0 else 100,
            }
        )
    return rows
