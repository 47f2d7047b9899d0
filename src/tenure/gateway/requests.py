"""Request parsing shared by the HTTP routes and the WebSocket session: ids, cursors, parameters, and the
`JobRequest` of a validated submit (bodies themselves are validated by the models of `control.models`)."""

from __future__ import annotations

import re
import uuid

from starlette.requests import Request

from tenure.control.admission import JobRequest
from tenure.control.models import JobSpec, shown
from tenure.gateway.auth import Principal
from tenure.gateway.problems import Problem

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


def submit_request(spec: JobSpec, who: Principal, key: str | None) -> JobRequest:
    """The `JobRequest` of a validated submit (an HTTP body or a WebSocket frame), as `who` submits it."""
    return JobRequest(
        spec.agent,
        spec.input,
        spec.priority,
        spec.requires or (),
        spec.deadline_s,
        spec.max_attempts,
        key,
        who.submit_tenant,
        concurrency_key=spec.concurrency_key,
        multitask=spec.multitask,
        mode=spec.mode,
        budget=None if spec.budget is None else spec.budget.model_dump(exclude_none=True),
        prefers=spec.prefers or (),
        strict=bool(spec.strict),
    )
