"""`tenure audit ID`: a job's audit as a readable timeline (or, with --json, the `GET /v1/jobs/{id}/audit` view
with every page of records joined); `tenure usage`: usage summed per tenant, agent or model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tenure.cli._common import out, ts, with_client
from tenure.control.audit import MAX_PAGE, job_audit, usage_report
from tenure.local import LocalClient

_KINDS = ("tool_calls", "evidence", "usage", "edits")


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _line(r: dict[str, Any]) -> str:
    if r["kind"] == "tool_call":
        outcome = f"✗ {r['error']}" if "error" in r else f"→ {_short(r.get('result'))}"
        took = f"  ({r['duration_s']:.3f} s)" if "duration_s" in r else ""
        return f"  {ts(r['started_at'])}  tool      {r['name']}  {_short(r.get('arguments'))} {outcome}{took}"
    if r["kind"] == "evidence":
        return f"  {ts(r['ts'])}  evidence  {r['evidence_kind']}  {_short(r['content'])}"
    if r["kind"] == "requeue":
        return f"  {ts(r['ts'])}  requeued  input {_short(r.get('previous_input'), 60)} → {_short(r.get('input'), 60)}"
    counts = " ".join(f"{k}={v:g}" for k, v in r["counts"].items())
    return f"  {ts(r['ts'])}  usage     {r['model'] or '-'}  {counts}"


def print_timeline(view: dict[str, Any]) -> None:
    """The audit view as a timeline: each execution, then its records and the steps it began, in order."""
    print(f"job {view['job_id']}  {view['agent']}  {view['state']}  ({view['attempts']} attempts)")
    records = sorted((r for k in _KINDS for r in view[k]), key=lambda r: (r["epoch"], r["seq"]))
    for e in view["executions"]:
        print(
            f"attempt {e['attempt']}  execution {e['id']}  epoch {e['epoch']}  worker {e['worker_id']}  "
            f"{ts(e['started_at'])} → {ts(e['ended_at'])}  {e['outcome']}"
        )
        for r in records:
            if r["epoch"] == e["epoch"]:
                print(_line(r))
        for s in view["steps"]:
            if s["epoch"] == e["epoch"]:
                print(f"  {ts(s['started_at'])}  step      {s['key']}  {s['state']}  → {_short(s['result'])}")
    totals = " ".join(f"{k}={v:g}" for k, v in view["usage_totals"].items())
    print(f"usage totals: {totals or '(none)'}")


async def cmd_audit(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        view = await job_audit(client.service, args.id, None, None, MAX_PAGE)
        while view["next_cursor"] is not None:  # the whole audit: every page of records
            page = await job_audit(client.service, args.id, None, view["next_cursor"], MAX_PAGE)
            for k in _KINDS:
                view[k] += page[k]
            view["next_cursor"] = page["next_cursor"]
        out(args, view, lambda: print_timeline(view))
        return 0

    return await with_client(args, go)


async def cmd_usage(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        report = await usage_report(client.service, None, args.from_s, args.to_s, args.group_by)

        def human() -> None:
            print(f"{args.group_by.upper():24}  {'REPORTS':>8}  {'INPUT':>12}  {'OUTPUT':>12}  {'COST USD':>12}")
            for g in [*report["groups"], {"key": "total", **report["total"]}]:
                print(
                    f"{g['key'] or '-'!s:24.24}  {g['reports']:>8}  {g['input_tokens']:>12g}  "
                    f"{g['output_tokens']:>12g}  {g['cost_usd']:>12.4f}"
                )

        out(args, report, human)
        return 0

    return await with_client(args, go)
