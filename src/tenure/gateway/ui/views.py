"""What the dashboard's pages show, computed from plain data: ages and counts as text, quantiles, the epoch
history of a job, the throughput chart, id prefixes as ranges. No I/O, no request."""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.staticfiles import StaticFiles

from tenure.contracts.insights import COUNT_CAP
from tenure.contracts.states import JobState
from tenure.contracts.types import Event, Execution, Job

log = logging.getLogger("tenure.gateway.ui")

PAGE = 50
HOUR_S = 3600.0
LATENCY_SAMPLE = 5000
MAX_REQUEUE = 500
_HEX = re.compile(r"[0-9a-f]{1,32}")
_STATIC = StaticFiles(packages=[("tenure.gateway.ui", "static")])


def _fmt_age(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    s = max(0.0, seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _fmt_count(n: int) -> str:
    return f"{n:,}+" if n >= COUNT_CAP else f"{n:,}"


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _ticket_since(ticket: str) -> float | None:
    """When a waiting-line ticket was made: its order is a UUIDv7 in hex, whose first 48 bits are milliseconds."""
    order = ticket.partition("/")[0]
    try:
        return int(order[:12], 16) / 1000.0
    except ValueError:
        return None


def id_range(text: str) -> tuple[str, str] | None:
    """The range of job ids that start with `text` (hex digits, dashes allowed), or None if it is not one."""
    digits = text.strip().lower().replace("-", "")
    if not _HEX.fullmatch(digits):
        return None

    def dashed(h: str) -> str:
        return str(uuid.UUID(h))

    return dashed(digits.ljust(32, "0")), dashed(digits.ljust(32, "f"))


def epoch_history(job: Job, executions: Sequence[Execution], events: Sequence[Event]) -> list[dict[str, Any]]:
    """One line per epoch of a job: the execution that ran under it (its worker and outcome), or that the claim
    of that epoch never started (released: its owner died, froze or drained before its start CAS)."""
    by_epoch: dict[int, list[Execution]] = {}
    for e in executions:
        by_epoch.setdefault(e.epoch, []).append(e)
    started: dict[int, str | None] = {}
    for ev in events:
        if ev.type == "execution.started":
            payload = ev.payload if isinstance(ev.payload, dict) else {}
            started[ev.epoch] = payload.get("worker_id")
    out = []
    for epoch in range(1, job.epoch + 1):
        runs = by_epoch.get(epoch, [])
        if runs:
            for r in runs:
                out.append(
                    {
                        "epoch": epoch,
                        "worker": r.worker_id,
                        "what": r.outcome or "-",
                        "started": r.started_at,
                        "ended": r.ended_at,
                    }
                )
        elif epoch == job.epoch and job.state in (JobState.RUNNING, JobState.WAITING):
            out.append(
                {
                    "epoch": epoch,
                    "worker": job.owner,
                    "what": job.state.value,
                    "started": job.execution_started_at,
                    "ended": None,
                }
            )
        elif epoch == job.epoch and job.state is JobState.QUEUED and job.owner is not None:
            out.append(
                {"epoch": epoch, "worker": job.owner, "what": "claimed, not started yet", "started": None, "ended": None}
            )
        elif epoch in started:
            out.append({"epoch": epoch, "worker": started[epoch], "what": "started", "started": None, "ended": None})
        else:
            out.append(
                {
                    "epoch": epoch,
                    "worker": None,
                    "what": "claimed, never started (the claim was released)",
                    "started": None,
                    "ended": None,
                }
            )
    return out


def throughput_chart(buckets: Sequence[Any], now: float) -> dict[str, Any]:
    """The last hour per minute as bars: finished jobs that succeeded, and those that did not."""
    first = int((now - HOUR_S) // 60 * 60) + 60
    minutes = [first + 60 * i for i in range(60)]
    ok = dict.fromkeys(minutes, 0)
    bad = dict.fromkeys(minutes, 0)
    for b in buckets:
        if b.minute in ok:
            (ok if b.state == "succeeded" else bad)[b.minute] += b.count
    top = max([ok[m] + bad[m] for m in minutes] + [1])
    bars = []
    for i, m in enumerate(minutes):
        bars.append(
            {
                "x": i * 10,
                "ok_h": round(100 * ok[m] / top, 2),
                "bad_h": round(100 * bad[m] / top, 2),
                "ok": ok[m],
                "bad": bad[m],
                "label": time.strftime("%H:%M", time.gmtime(m)),
            }
        )
    return {"bars": bars, "top": top}
