"""The job page's audit timeline and its requeue with an edited input.

    GET  /ui/jobs/{id}/audit     the timeline alone, re-rendered (the job page refreshes it when its stream
                                 delivers an event): `?audit=EPOCH.SEQ` (the audit cursor), `&audit_limit=N`
    POST /ui/api/jobs/{id}/requeue
                                 {"input": "<the textarea's text>"}: the text is parsed here, held to the rules
                                 of admission, and the job requeued with it (`JobsService.requeue`, the API's
                                 own path); a text that is not JSON is a 422 with the parser's message

The timeline reads the audit through the API's read model (`control/audit.py`, `GET /v1/jobs/{id}/audit`),
tenant-checked like the job, one page of records at a time, and the job's budget (`read_budget`).
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tenure.contracts.errors import IllegalTransition, InvalidRequest, NotFound, StoreUnavailable
from tenure.contracts.types import Job, is_uuid
from tenure.control.audit import AUDIT_CURSOR, MAX_PAGE, job_audit
from tenure.control.json_input import parse_json
from tenure.gateway.auth import Principal
from tenure.gateway.ui.base import PageError, PagesBase
from tenure.gateway.ui.timeline import audit_timeline

AUDIT_PAGE = 200
MAX_EDIT_BODY = 4 * 1024 * 1024
"""The largest body the requeue form may send (its text as a JSON string): the input limit of admission is
checked on the parsed value; this only bounds what is read."""


class JobPages(PagesBase):
    """The parts of the job page that read the audit or requeue with an edited input."""

    def _audit_params(self, request: Request) -> tuple[str | None, int]:
        q = request.query_params
        cursor = q.get("audit", "").strip() or None
        if cursor is not None and not AUDIT_CURSOR.match(cursor):
            raise PageError(400, "The audit's page cursor is EPOCH.SEQ (the link under the timeline).")
        text = q.get("audit_limit", "").strip()
        if not text:
            return cursor, AUDIT_PAGE
        if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
            raise PageError(400, f"audit_limit is a number of records from 1 to {MAX_PAGE}.")
        return cursor, int(text)

    async def _timeline(self, request: Request, job: Job, who: Principal) -> dict[str, Any]:
        """The template context of the audit timeline of one page (`t`, and the links of the pager)."""
        cursor, limit = self._audit_params(request)
        try:
            audit = await job_audit(self.gw.jobs, job.id, who.tenant, cursor, limit)
        except NotFound:
            raise PageError(404, "The job is gone (removed by the retention?).") from None
        budget = await self.gw.store.read_budget(job.id)
        keep = {"audit_limit": str(limit)} if limit != AUDIT_PAGE else {}
        base = f"/ui/jobs/{job.id}"
        nxt = audit["next_cursor"]
        return {
            "t": audit_timeline(audit, budget, paged=cursor is not None),
            "first_url": base + ("?" + urlencode(keep) if keep else ""),
            "next_url": f"{base}?{urlencode({'audit': nxt, **keep})}" if nxt else None,
            "audit_query": urlencode({k: v for k, v in {"audit": cursor or "", **keep}.items() if v}),
        }

    async def job_audit_fragment(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            job = await self._load_job(request, who)
            ctx = await self._timeline(request, job, who)
            html = self.env.get_template("_audit.html").render(**ctx)
            return JSONResponse({"html": html, "records": ctx["t"]["count"]})

        return await self._page(request, build)

    async def _load_job(self, request: Request, who: Principal) -> Job:
        job_id = request.path_params["job_id"]
        job = await self.gw.store.get_job(str(uuid.UUID(job_id)), who.tenant) if is_uuid(job_id) else None
        if job is None:
            raise PageError(404, f"No job {job_id[:40]!r} (or not one of yours).")
        return job

    async def requeue_edited(self, request: Request) -> Response:
        """Requeue one job with the input typed into its page's form (docs/dashboard.md)."""
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        body = await request.body()
        if len(body) > MAX_EDIT_BODY:
            return JSONResponse({"detail": f"the form sent more than {MAX_EDIT_BODY} bytes"}, 413)
        try:
            form = parse_json(body or b"null", "the form's body")
        except InvalidRequest as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        text = form.get("input") if isinstance(form, dict) else None
        if not isinstance(text, str):
            return JSONResponse({"detail": 'the body is {"input": "<the new input as JSON text>"}'}, 422)
        if not text.strip():
            return JSONResponse({"detail": 'The input is empty: type a JSON value (null, {} or "text" are JSON).'}, 422)
        try:
            value = parse_json(text, "The input")
        except InvalidRequest as exc:
            return JSONResponse({"detail": f"{exc} (nothing was requeued)", "field": "input"}, 422)
        job_id = request.path_params["job_id"]
        if not is_uuid(job_id):
            return JSONResponse({"detail": "not found"}, 404)
        try:
            job = await self.gw.jobs.requeue(str(uuid.UUID(job_id)), who.tenant, {"input": value})
        except NotFound:
            return JSONResponse({"detail": "No such job (or not one of yours)."}, 404)
        except IllegalTransition as exc:
            return JSONResponse({"detail": f"This job cannot be requeued now: {exc}"}, 409)
        except InvalidRequest as exc:
            return JSONResponse({"detail": f"{exc} (nothing was requeued)", "field": "input"}, 422)
        except StoreUnavailable as exc:
            return JSONResponse({"detail": f"The store did not answer; retry shortly ({exc})."}, 503)
        return JSONResponse({"outcome": "requeued", "state": job.state.value, "epoch": job.epoch, "job_id": job.id})
