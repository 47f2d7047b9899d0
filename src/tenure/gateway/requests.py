"""Request parsing shared by the HTTP routes and the WebSocket session: ids, cursors, parameters, submit bodies."""

from __future__ import annotations

import re
import uuid
from typing import Any

from starlette.requests import Request

from tenure.contracts.errors import InvalidRequest
from tenure.control.admission import JobRequest, is_finite_number, shown
from tenure.gateway.problems import Problem

SUBMIT_FIELDS = {"agent", "input", "priority", "requires", "deadline_s", "max_attempts"}
MAX_CURSOR_PART = 2**63 - 1  # epochs and seqs are 64-bit integers in both stores
# ASCII digits only (str.isdigit also takes "²" and "٣"), and few enough that int() stays cheap.
_CURSOR = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")


def parse_job_id(text: str) -> str:
    """A job id from a path, normalised; anything but a UUID is a job that does not exist (404)."""
    try:
        return str(uuid.UUID(text))
    except (ValueError, AttributeError, TypeError):
        raise Problem(404, "Not found", f"no job {shown(text)}", "not-found") from None


def parse_cursor_param(text: str, where: str) -> tuple[int, int]:
    """An event cursor `EPOCH-SEQ` from a parameter or header named `where`, else a 400 problem. Both parts are
    bounded here: a 25-digit seq used to reach the store and fail there (a 500)."""
    m = _CURSOR.fullmatch(text)
    if m is not None:
        epoch, seq = int(m[1]), int(m[2])
        if epoch <= MAX_CURSOR_PART and seq <= MAX_CURSOR_PART:
            return epoch, seq
    raise Problem(
        400,
        "Bad cursor",
        f"{where}: bad event cursor {shown(text)}: expected EPOCH-SEQ, two integers from 0 to 2^63-1, e.g. 1-42",
        "bad-cursor",
    )


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within [lo, hi], else a 400 problem."""
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise Problem(400, "Bad parameter", f"{name} must be an integer, not {shown(text)}", "bad-parameter") from None
    if not lo <= value <= hi:
        raise Problem(400, "Bad parameter", f"{name} must be from {lo} to {hi}, not {value}", "bad-parameter")
    return value


def check_submit_body(body: Any, tenant: str, key: str | None) -> JobRequest:
    """Type-check a submit body (HTTP or WebSocket) into a `JobRequest`; the admission validates the rest."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    unknown = set(body) - SUBMIT_FIELDS
    if unknown:
        names = ", ".join(shown(u, 40) for u in sorted(unknown)[:5])  # a body may hold a megabyte of names
        if len(unknown) > 5:
            names += f" and {len(unknown) - 5} more"
        raise InvalidRequest(f"unknown fields: {names} (allowed: {', '.join(sorted(SUBMIT_FIELDS))})")
    agent = body.get("agent")
    if not isinstance(agent, str) or not agent:
        raise InvalidRequest("agent is required: the name of a registered agent")
    for name in ("priority", "max_attempts"):
        v = body.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise InvalidRequest(f"{name} must be an integer, not {shown(v)}")
    deadline = body.get("deadline_s")
    if deadline is not None and not is_finite_number(deadline):
        raise InvalidRequest(f"deadline_s must be a number of seconds, not {shown(deadline)}")
    requires = body.get("requires", [])
    if requires is None:
        requires = []
    if not isinstance(requires, list) or not all(isinstance(t, str) for t in requires):
        raise InvalidRequest("requires must be a list of capability tags")
    return JobRequest(
        agent,
        body.get("input"),
        body.get("priority"),
        requires,
        deadline,
        body.get("max_attempts"),
        key,
        tenant,
    )
