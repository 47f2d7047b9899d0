"""The dashboard: server-rendered pages at `/ui` (Jinja2), served by the gateway beside the API.

    GET  /                     redirect to /ui
    GET  /ui                   overview: queue depth, the hour's throughput, queue wait and dispatch, circuits
    GET  /ui/jobs              the live jobs list (filters, search by id or idempotency key, counts, keyset pages)
    GET  /ui/jobs/{id}         one job: input, epochs, executions, the live event stream, result, the audit
                               timeline (`?audit=EPOCH.SEQ` pages it), its buttons, requeue with an edited input
    GET  /ui/workers           the registry            GET /ui/quotas     leases held and waiting, per quota
    GET  /ui/dead              dead letters            GET /ui/labs       the live labs (gateway/ui/labs.py)
    GET|POST /ui/login, POST /ui/logout                the session (sessions.py)
    POST /ui/api/requeue       {"job_ids": [...]}: requeue one or many (the store's `requeue`)
    POST /ui/api/workers/{id}/drain  drain a worker (admins: the workers page's Drain button; ops.py)
    POST /ui/api/jobs/{id}/requeue  {"input": "<JSON text>"}: requeue one with an edited input (jobpage.py)

Every page and fragment is scoped to the caller's tenant exactly as the API is: a tenant's session sees its own
jobs only, and another tenant's job is "not found". The buttons of the job page call the API's own routes
(`/v1/jobs/{id}/cancel`, `/input`, `/approve`) and its live stream is the API's SSE (`/v1/jobs/{id}/events`),
authenticated by the session cookie; requeue is its own route here because it takes many ids at once (the API's
`POST /v1/jobs/{id}/requeue` takes one). Reads go through
`Insights` (contracts/insights.py), each bounded, so no filter the pages offer makes the store scan history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from tenure.contracts.errors import IllegalTransition, NotFound, TenureError
from tenure.contracts.insights import JobQuery, JobSummary
from tenure.contracts.states import JobState
from tenure.contracts.types import is_uuid
from tenure.control.admission import idem_digest
from tenure.gateway.auth import Principal
from tenure.gateway.ui.base import PageError
from tenure.gateway.ui.jobpage import JobPages
from tenure.gateway.ui.ops import OpsPages
from tenure.gateway.ui.views import _STATIC, MAX_REQUEUE, PAGE, _pretty, epoch_history, id_range

if TYPE_CHECKING:
    pass

log = logging.getLogger("tenure.gateway.ui")


class Dashboard(OpsPages, JobPages):
    """The dashboard of one gateway process. `routes()` are mounted with `Gateway.mount_ui`."""

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.root, methods=["GET"]),
            Route("/ui", self.overview, methods=["GET"]),
            Route("/ui/login", self.login_page, methods=["GET"]),
            Route("/ui/login", self.login, methods=["POST"]),
            Route("/ui/logout", self.logout, methods=["POST"]),
            Route("/ui/jobs", self.jobs, methods=["GET"]),
            Route("/ui/jobs/rows", self.job_rows, methods=["GET"]),
            Route("/ui/jobs/{job_id}", self.job, methods=["GET"]),
            Route("/ui/jobs/{job_id}/summary", self.job_summary, methods=["GET"]),
            Route("/ui/jobs/{job_id}/audit", self.job_audit_fragment, methods=["GET"]),
            Route("/ui/workers", self.workers, methods=["GET"]),
            Route("/ui/quotas", self.quotas, methods=["GET"]),
            Route("/ui/dead", self.dead, methods=["GET"]),
            Route("/ui/labs", self.labs, methods=["GET"]),
            Route("/ui/labs/{name}", self.lab, methods=["GET"]),
            Route("/ui/api/requeue", self.requeue, methods=["POST"]),
            Route("/ui/api/workers/{worker_id}/drain", self.drain_worker, methods=["POST"]),
            Route("/ui/api/jobs/{job_id}/requeue", self.requeue_edited, methods=["POST"]),
            Route("/ui/api/labs/{name}", self.lab_start, methods=["POST"]),
            Route("/ui/api/labs/{name}/stop", self.lab_stop, methods=["POST"]),
            Route("/ui/api/labs/{name}/events", self.lab_events, methods=["GET"]),
            Mount("/ui/static", app=_STATIC, name="ui-static"),
        ]

    # -- sessions -------------------------------------------------------------------------------------------------------
    async def root(self, _request: Request) -> Response:
        return RedirectResponse("/ui", 307)

    async def login_page(self, request: Request, error: str = "", status: int = 200) -> Response:
        nxt = request.query_params.get("next", "/ui")
        if not nxt.startswith("/ui") or nxt.startswith("//"):
            nxt = "/ui"
        html = self.env.get_template("login.html").render(error=error, next=nxt, open=self.sessions.open)
        return HTMLResponse(html, status, headers={"Cache-Control": "no-store"})

    async def login(self, request: Request) -> Response:
        if not self.sessions.same_origin(request):
            return await self.login_page(request, "This form must be sent from the dashboard's own page.", 403)
        # application/x-www-form-urlencoded, read here: Starlette's form parser needs python-multipart.
        body = await request.body()
        form = dict(parse_qsl(body[:8192].decode("utf-8", "replace"), keep_blank_values=True))
        key = form.get("key", "")
        nxt = form.get("next", "/ui")
        if not nxt.startswith("/ui") or nxt.startswith("//"):
            nxt = "/ui"
        value = self.sessions.login(key)
        if value is None:
            return await self.login_page(request, "That key is not one this gateway knows.", 401)
        response = RedirectResponse(nxt, 303)
        self.sessions.set_cookie(response, value, request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/ui/login", 303)
        if self.sessions.same_origin(request):
            self.sessions.clear_cookie(response, request.url.scheme == "https")
        return response

    # -- jobs -----------------------------------------------------------------------------------------------------------
    def _filters(self, request: Request, who: Principal) -> dict[str, str]:
        q = request.query_params
        state = q.get("state", "").strip()
        if state and state not in {s.value for s in JobState}:
            raise PageError(400, f"There is no state {state[:40]!r}.")
        agent = q.get("agent", "").strip()
        if "\x00" in agent or len(agent) > 200:
            raise PageError(400, "An agent name has no NUL character and at most 200 characters.")
        tenant = q.get("tenant", "").strip() if who.is_admin else ""
        if "\x00" in tenant or len(tenant) > 200:
            raise PageError(400, "A tenant name has no NUL character and at most 200 characters.")
        search = q.get("q", "").strip()
        if "\x00" in search or len(search) > 500:
            raise PageError(400, "A search is an id or an idempotency key: no NUL character, at most 500 characters.")
        before = q.get("before", "").strip()
        if before and not is_uuid(before):
            raise PageError(400, "The page cursor is the id of a job.")
        return {"state": state, "agent": agent, "tenant": tenant, "q": search, "before": before}

    async def _job_list(self, who: Principal, f: Mapping[str, str]) -> tuple[list[JobSummary], str | None, str | None]:
        tenant = who.tenant if not who.is_admin else (f["tenant"] or None)
        state = JobState(f["state"]) if f["state"] else None
        agent = f["agent"] or None
        if f["q"]:
            found: dict[str, JobSummary] = {}
            rng = id_range(f["q"])
            if rng is not None:
                page = await self.insights.job_page(JobQuery(tenant, state, agent, limit=PAGE, id_from=rng[0], id_to=rng[1]))
                found.update((j.id, j) for j in page.jobs)
            tenants = [tenant] if tenant is not None else await self._all_tenants()
            keys = [(t, idem_digest(t, f["q"])) for t in tenants]
            for j in await self.insights.jobs_by_idempotency(keys):
                if (state is None or j.state is state) and (agent is None or j.agent == agent):
                    found[j.id] = j
            return sorted(found.values(), key=lambda j: j.id, reverse=True)[:PAGE], None, None
        page = await self.insights.job_page(JobQuery(tenant, state, agent, f["before"] or None, PAGE))
        return page.jobs, page.next_before, page.scanned_to

    async def _all_tenants(self) -> list[str]:
        names = set(self.gw.auth.tenant_names()) | {"default"} | set(await self.insights.tenants())
        return sorted(names)

    async def _counts(self, who: Principal, f: Mapping[str, str]) -> dict[str, int]:
        tenant = who.tenant if not who.is_admin else (f["tenant"] or None)
        return dict(await self.insights.count_by_state(tenant))

    async def jobs(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            f = self._filters(request, who)
            (jobs, nxt, scanned), counts, now = await asyncio.gather(
                self._job_list(who, f), self._counts(who, f), self.gw.store.server_time()
            )
            tenants = await self._all_tenants() if who.is_admin else []
            base = {k: v for k, v in f.items() if v and k != "before"}
            return self._render(
                request,
                "jobs.html",
                who,
                jobs=jobs,
                counts=counts,
                now=now,
                f=f,
                tenants=tenants,
                next_url="/ui/jobs?" + urlencode({**base, "before": nxt}) if nxt else None,
                scanned_to=scanned,
                live=not f["before"] and not f["q"],
                query=urlencode(base),
                filter_url=lambda **kw: "/ui/jobs?" + urlencode({k: v for k, v in {**base, **kw}.items() if v}),
            )

        return await self._page(request, build)

    async def job_rows(self, request: Request) -> Response:
        """The live part of the jobs page: its rows and counts, re-rendered (the page polls it every second)."""

        async def build(who: Principal) -> Response:
            f = self._filters(request, who)
            (jobs, _nxt, _scanned), counts, now = await asyncio.gather(
                self._job_list(who, f), self._counts(who, f), self.gw.store.server_time()
            )
            base = {k: v for k, v in f.items() if v and k != "before"}
            ctx = {
                "jobs": jobs,
                "counts": counts,
                "now": now,
                "f": f,
                "who": who,
                "filter_url": lambda **kw: "/ui/jobs?" + urlencode({k: v for k, v in {**base, **kw}.items() if v}),
            }
            rows = self.env.get_template("_job_rows.html").render(**ctx)
            chips = self.env.get_template("_counts.html").render(**ctx)
            return JSONResponse({"rows": rows, "counts": chips, "newest": jobs[0].id if jobs else None})

        return await self._page(request, build)

    async def job(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            job = await self._load_job(request, who)
            executions, events, now, timeline, route = await asyncio.gather(
                self.gw.store.list_executions(job.id),
                self.gw.store.read_events(job.id, None, 1000),
                self.gw.store.server_time(),
                self._timeline(request, job, who),
                self.gw.jobs.route(job),  # as GET /v1/jobs/{id} shows it (docs/routing.md)
            )
            return self._render(
                request,
                "job.html",
                who,
                job=job,
                executions=executions,
                events=events,
                epochs=epoch_history(job, executions, events),
                cursor=events[-1].cursor if events else "",
                now=now,
                more_events=len(events) == 1000,
                route=route,
                **timeline,
            )

        return await self._page(request, build)

    async def job_summary(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            job = await self._load_job(request, who)
            executions, events, now = await asyncio.gather(
                self.gw.store.list_executions(job.id),
                self.gw.store.read_events(job.id, None, 1000),
                self.gw.store.server_time(),
            )
            html = self.env.get_template("_job_summary.html").render(
                job=job, executions=executions, epochs=epoch_history(job, executions, events), now=now, who=who
            )
            return JSONResponse({"html": html, "state": job.state.value, "epoch": job.epoch, "input": _pretty(job.input)})

        return await self._page(request, build)

    async def requeue(self, request: Request) -> Response:
        """Requeue one or many jobs of the caller (the dead-letter page's buttons): one store `requeue` each."""
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None
        ids = body.get("job_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or len(ids) > MAX_REQUEUE or not all(isinstance(i, str) for i in ids):
            return JSONResponse({"detail": f'the body is {{"job_ids": [1 to {MAX_REQUEUE} job ids]}}'}, 422)
        results = []
        for job_id in ids:
            if not is_uuid(job_id):
                results.append({"job_id": job_id[:60], "outcome": "unknown"})
                continue
            try:
                job = await self.gw.store.requeue(str(uuid.UUID(job_id)), who.tenant)
                results.append({"job_id": job.id, "outcome": "requeued", "state": job.state.value})
            except NotFound:
                results.append({"job_id": job_id, "outcome": "unknown"})
            except IllegalTransition as exc:
                results.append({"job_id": job_id, "outcome": "refused", "detail": str(exc)})
            except TenureError as exc:
                return JSONResponse({"detail": str(exc), "results": results}, 503)
        return JSONResponse({"results": results})
