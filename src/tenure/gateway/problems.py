"""JSON problem bodies (RFC 9457): every error the HTTP API returns is `{type, title, status, detail}`,
never a stack trace."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from tenure.contracts.errors import (
    ArtifactsUnavailable,
    IdempotencyConflict,
    IllegalTransition,
    InputTooLarge,
    InvalidRequest,
    KeyBusy,
    NotFound,
    StoreUnavailable,
    TenureError,
    UnknownAgent,
)
from tenure.control.gate import CircuitOpen, QueueFull
from tenure.control.json_input import InvalidJSON
from tenure.control.tenant_budgets import TenantBudgetExhausted

TYPE_BASE = "https://tenure.dev/problems/"


class Problem(Exception):
    """Raise anywhere in a handler to answer with this problem."""

    def __init__(self, status: int, title: str, detail: str, kind: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.kind = kind
        self.extra = extra
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {
            "type": TYPE_BASE + self.kind,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }

    def response(self) -> JSONResponse:
        return _ProblemResponse(self.body(), self.status, headers=self.headers, media_type="application/problem+json")


class _ProblemResponse(JSONResponse):
    """A problem body in ASCII JSON: a detail that quotes a client's text (a field name, an agent) renders even if
    that text is not Unicode, where Starlette's UTF-8 rendering would raise and turn a 4xx into a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def from_error(exc: TenureError) -> Problem:
    """The problem for one of Tenure's own errors."""
    if isinstance(exc, IdempotencyConflict):
        return Problem(
            409,
            "Idempotency key reused",
            str(exc),
            "idempotency-conflict",
            existing_job_id=exc.existing_job_id,
        )
    if isinstance(exc, KeyBusy):
        return Problem(409, "Concurrency key busy", str(exc), "key-busy", running_job_id=exc.running_job_id)
    if isinstance(exc, InvalidJSON):
        return Problem(400, exc.title, str(exc), exc.kind)
    if isinstance(exc, UnknownAgent):
        return Problem(422, "Unknown agent", str(exc), "unknown-agent")
    if isinstance(exc, InputTooLarge):
        return Problem(413, "Input too large", str(exc), "input-too-large")
    if isinstance(exc, InvalidRequest):
        return Problem(422, "Invalid request", str(exc), "invalid-request")
    if isinstance(exc, NotFound):
        return Problem(404, "Not found", str(exc), "not-found")
    if isinstance(exc, IllegalTransition):
        return Problem(409, "Illegal transition", str(exc), "illegal-transition")
    if isinstance(exc, TenantBudgetExhausted):
        p = Problem(429, "Tenant budget exhausted", str(exc), "tenant-budget-exhausted")
        p.headers["Retry-After"] = str(exc.retry_after_s)
        return p
    if isinstance(exc, QueueFull):
        p = Problem(429, "Too many queued jobs", str(exc), "queue-full")
        p.headers["Retry-After"] = str(exc.retry_after_s)
        return p
    if isinstance(exc, CircuitOpen):
        p = Problem(503, "Circuit open", str(exc), "circuit-open")
        p.headers["Retry-After"] = str(exc.retry_after_s)
        return p
    if isinstance(exc, ArtifactsUnavailable):  # its message names the bucket: the gateway logs it, never sends it
        p = Problem(
            503, "Artifact store unavailable", "the artifact store did not answer; retry shortly", "artifacts-unavailable"
        )
        p.headers["Retry-After"] = "1"
        return p
    if isinstance(exc, StoreUnavailable):
        p = Problem(503, "Store unavailable", "the job store did not answer; retry shortly", "store-unavailable")
        p.headers["Retry-After"] = "1"
        return p
    return Problem(500, "Internal error", f"{exc.code}: {exc}", "internal")
