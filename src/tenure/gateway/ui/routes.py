"""The dashboard: server-rendered pages at `/ui` (Jinja2), served by the gateway beside the API.

    GET  /                     redirect to /ui
    GET  /ui                   overview: queue depth, the hour's throughput, queue wait and dispatch, circuits
    GET  /ui/jobs              the live jobs list (filters, search by id or idempotency key, counts, keyset pages)
    GET  /ui/jobs/{id}         one job: input, epochs, executions, the live event stream, result, its buttons
    GET  /ui/workers           the registry            GET /ui/quotas     leases held and waiting, per quota
    GET  /ui/dead              dead letters            GET /ui/labs       the live labs (gateway/ui/labs.py)
    GET|POST /ui/login, POST /ui/logout                the session (sessions.py)
    POST /ui/api/requeue       {"job_ids": [...]}: requeue one or many (the store's `requeue`)

Every page and fragment is scoped to the caller's tenant exactly as the API is: a tenant's session sees its own
jobs only, and another tenant's job is "not found". The buttons of the job page call the API's own routes
(`/v1/jobs/{id}/cancel`, `/input`, `/approve`) and its live stream is the API's SSE (`/v1/jobs/{id}/events`),
authenticated by the session cookie; requeue has no API route, so it is the one action here. Reads go through
`Insights` (contracts/insights.py), each bounded, so no filter the pages offer makes the store scan history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tenure.contracts.errors import IllegalTransition, NotFound, StoreUnavailable, TenureError
from tenure.contracts.insights import COUNT_CAP, Insights, JobQuery, JobSummary
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.states import REQUEUEABLE, TERMINAL, JobState
from tenure.contracts.store import Leases, line_key, ticket_holder
from tenure.contracts.types import Event, Execution, Job, is_uuid
from tenure.control.admission import idem_digest
from tenure.gateway.auth import Principal
from tenure.gateway.ui.labs import LabRunner
from tenure.gateway.ui.sessions import Sessions

if TYPE_CHECKING:
    from tenure.gateway.app import Gateway

log = logging.getLogger("tenure.gateway.ui")

PAGE = 50
HOUR_S = 3600.0
LATENCY_SAMPLE = 5000
MAX_REQUEUE = 500
_HEX = re.compile(r"[0-9a-f]{1,32}")
_STATIC = StaticFiles(packages=[("tenure.gateway.ui", "static")])


class PageError(Exception):
    """A request the page refuses (a bad filter): answered with the page's own 4xx, never a 500."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class DashboardConfig:
    """What the composition root gives the dashboard besides the gateway: quotas and their lease backend, where
    the loop lag of workers can be read (the `/metrics` files of `tenure up`), and the lab runner."""

    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)
    leases: Leases | None = None
    loop_lags: Callable[[], Awaitable[Mapping[str, float]]] | None = None
    labs: LabRunner | None = None


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


class Dashboard:
    """The dashboard of one gateway process. `routes()` are mounted with `Gateway.mount_ui`."""

    def __init__(self, gateway: Gateway, insights: Insights, sessions: Sessions, config: DashboardConfig) -> None:
        self.gw = gateway
        self.insights = insights
        self.sessions = sessions
        self.config = config
        self.env = Environment(
            loader=PackageLoader("tenure.gateway.ui", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,  # no stat() of a template file on the event loop per render
        )
        self.env.filters.update(age=_fmt_age, count=_fmt_count, ts=_ts, pretty=_pretty)
        self.env.globals.update(terminal=TERMINAL, requeueable=REQUEUEABLE, states=[s.value for s in JobState])

    def preload(self) -> None:
        """Compile every template (file reads: call it off the event loop, before serving)."""
        for name in self.env.list_templates(extensions=["html"]):
            self.env.get_template(name)

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
            Route("/ui/workers", self.workers, methods=["GET"]),
            Route("/ui/quotas", self.quotas, methods=["GET"]),
            Route("/ui/dead", self.dead, methods=["GET"]),
            Route("/ui/labs", self.labs, methods=["GET"]),
            Route("/ui/labs/{name}", self.lab, methods=["GET"]),
            Route("/ui/api/requeue", self.requeue, methods=["POST"]),
            Route("/ui/api/labs/{name}", self.lab_start, methods=["POST"]),
            Route("/ui/api/labs/{name}/stop", self.lab_stop, methods=["POST"]),
            Route("/ui/api/labs/{name}/events", self.lab_events, methods=["GET"]),
            Mount("/ui/static", app=_STATIC, name="ui-static"),
        ]

    # -- who is asking -----------------------------------------------------------------------------------------------
    def _who(self, request: Request) -> Principal | None:
        header = request.headers.get("authorization")
        if header is not None:
            return self.gw.auth.authenticate(header)
        session = self.sessions.read(request)
        return None if session is None else session.principal

    def _render(self, request: Request, template: str, who: Principal, status: int = 200, **ctx: Any) -> HTMLResponse:
        session = self.sessions.read(request)
        html = self.env.get_template(template).render(
            who=who,
            label="admin" if who.is_admin else f"tenant {who.tenant}",
            csrf=session.csrf if session is not None else "",
            open=self.sessions.open,
            path=request.url.path,
            labs_enabled=self.config.labs is not None and self._may_run_labs(who),
            **ctx,
        )
        return HTMLResponse(html, status, headers={"Cache-Control": "no-store"})

    async def _page(self, request: Request, build: Callable[[Principal], Awaitable[Response]]) -> Response:
        """Authenticate a page (to the login form when signed out) and answer its errors as pages, never 5xx."""
        who = self._who(request)
        if who is None:
            if request.headers.get("authorization") is not None or request.url.path.startswith("/ui/api"):
                return JSONResponse({"detail": "sign in first"}, 401)
            target = "/ui/login?" + urlencode(
                {"next": request.url.path + ("?" + request.url.query if request.url.query else "")}
            )
            return RedirectResponse(target, 303)
        started = time.perf_counter()
        try:
            response = await build(who)
            # The time spent answering at the server (bench/ui.py reads it; so can a browser's devtools).
            response.headers["Server-Timing"] = f"page;dur={(time.perf_counter() - started) * 1000:.1f}"
            return response
        except PageError as exc:
            return self._render(request, "error.html", who, exc.status, message=exc.message)
        except StoreUnavailable as exc:
            log.warning("dashboard: the store did not answer: %s", exc)
            return self._render(request, "error.html", who, 503, message="The store did not answer; retry shortly.")

    def _may_run_labs(self, who: Principal) -> bool:
        return who.is_admin or self.sessions.open

    def _check_change(self, request: Request) -> Principal:
        """A change made from a dashboard page: a key, or the session with its CSRF token, from this origin."""
        header = request.headers.get("authorization")
        who = self.gw.auth.authenticate(header) if header is not None else self.sessions.principal(request, "POST")
        if who is None:
            raise PageError(403, "sign in again: this change needs the page's session token")
        return who

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

    async def _load_job(self, request: Request, who: Principal) -> Job:
        job_id = request.path_params["job_id"]
        job = await self.gw.store.get_job(str(uuid.UUID(job_id)), who.tenant) if is_uuid(job_id) else None
        if job is None:
            raise PageError(404, f"No job {job_id[:40]!r} (or not one of yours).")
        return job

    async def job(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            job = await self._load_job(request, who)
            executions, events, now = await asyncio.gather(
                self.gw.store.list_executions(job.id),
                self.gw.store.read_events(job.id, None, 1000),
                self.gw.store.server_time(),
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
            return JSONResponse({"html": html, "state": job.state.value, "epoch": job.epoch})

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

    # -- workers, quotas, dead letters ------------------------------------------------------------------------------------
    async def workers(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            include_gone = request.query_params.get("all") == "1"
            workers, now = await asyncio.gather(self.gw.store.list_workers(include_gone), self.gw.store.server_time())
            lags: Mapping[str, float] = {}
            if self.config.loop_lags is not None:
                try:
                    lags = await self.config.loop_lags()
                except Exception as exc:  # the metrics files are a nicety: the registry is shown without them
                    log.debug("loop lag unavailable: %s", exc)
            return self._render(
                request,
                "workers.html",
                who,
                workers=workers,
                now=now,
                lags=lags,
                include_gone=include_gone,
                lag_known=self.config.loop_lags is not None,
                show_ids=who.is_admin,
                fragment=request.query_params.get("fragment") == "1",
            )

        return await self._page(request, build)

    async def quotas(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            now = await self.gw.store.server_time()
            rows = await self._quota_rows(who) if self.config.leases is not None else []
            return self._render(
                request,
                "quotas.html",
                who,
                quotas=rows,
                now=now,
                has_backend=self.config.leases is not None,
                configured=bool(self.config.quotas),
                fragment=request.query_params.get("fragment") == "1",
            )

        return await self._page(request, build)

    async def _quota_rows(self, who: Principal) -> list[dict[str, Any]]:
        leases = self.config.leases
        assert leases is not None
        rows: list[dict[str, Any]] = []
        executions: set[str] = set()
        for key, spec in sorted(self.config.quotas.items()):
            holders = await leases.holders(key)
            line = sorted(await leases.holders(line_key(key)))
            rows.append({"spec": spec, "holders": holders, "line": line})
            executions.update(h.rpartition(":")[0] for h in holders)
            executions.update(ticket_holder(t).rpartition(":")[0] for t in line)
        found = await self.insights.jobs_by_execution(sorted(executions))
        by_execution = {j.execution_id: j for j in found if j.execution_id is not None}

        def who_holds(holder: str) -> dict[str, Any]:
            j = by_execution.get(holder.rpartition(":")[0])
            visible = j is not None and (who.is_admin or j.tenant == who.tenant)
            return {"holder": holder, "job": j if visible else None, "other": j is not None and not visible}

        for row in rows:
            spec = row["spec"]
            row["held"] = [who_holds(h) for h in row["holders"]]
            row["waiting"] = []
            for position, ticket in enumerate(row["line"], start=1):
                entry = who_holds(ticket_holder(ticket))
                entry.update(position=position, since=_ticket_since(ticket))
                full = len(row["holders"]) >= spec.limit
                entry["blocked_on"] = (
                    f"{spec.key}: all {spec.limit} slots held" if full else f"{spec.key}: a slot is being handed over"
                )
                if position > 1:
                    entry["blocked_on"] += f", {position - 1} ahead in line"
                row["waiting"].append(entry)
        return rows

    async def dead(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            before = request.query_params.get("before", "").strip()
            if before and not is_uuid(before):
                raise PageError(400, "The page cursor is the id of a job.")
            tenant = who.tenant
            page, now = await asyncio.gather(
                self.insights.job_page(JobQuery(tenant, JobState.DEAD, None, before or None, PAGE)),
                self.gw.store.server_time(),
            )
            return self._render(
                request,
                "dead.html",
                who,
                jobs=page.jobs,
                now=now,
                next_url=f"/ui/dead?before={page.next_before}" if page.next_before else None,
            )

        return await self._page(request, build)

    # -- overview -----------------------------------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            now = await self.gw.store.server_time()
            since = now - HOUR_S
            gate = self.gw.config.gate
            counts, buckets, sample, failures = await asyncio.gather(
                self.insights.count_by_state(who.tenant),
                self.insights.finished_since(who.tenant, since),
                self.insights.latency_sample(who.tenant, since, LATENCY_SAMPLE),
                self.insights.circuit_failures(now - gate.breaker_window_s),
            )
            circuits = []
            for row in failures:
                state = await self.gw.store.circuit_state(
                    row.key, gate.breaker_threshold, gate.breaker_window_s, gate.breaker_open_s
                )
                circuits.append(
                    {"key": row.key, "failures": state.failures, "open_for_s": state.open_for_s, "last": row.last_failure_at}
                )
            waits = [s.queue_wait_s for s in sample if s.queue_wait_s is not None]
            dispatch = [s.dispatch_s for s in sample if s.dispatch_s is not None]
            pct = {
                name: {q: _quantile(values, q) for q in (0.5, 0.9, 0.99)} | {"n": len(values)}
                for name, values in (("queue wait", waits), ("dispatch", dispatch))
            }
            return self._render(
                request,
                "overview.html",
                who,
                counts=counts,
                chart=throughput_chart(buckets, now),
                finished=sum(b.count for b in buckets),
                pct=pct,
                circuits=circuits,
                gate=gate,
                now=now,
                sample_cap=LATENCY_SAMPLE,
            )

        return await self._page(request, build)

    # -- labs -------------------------------------------------------------------------------------------------------------
    async def labs(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            runner = self.config.labs
            return self._render(
                request,
                "labs.html",
                who,
                catalog=runner.catalog() if runner is not None else [],
                enabled=runner is not None,
                allowed=self._may_run_labs(who),
                current=runner.current() if runner is not None else None,
            )

        return await self._page(request, build)

    async def lab(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            runner = self.config.labs
            name = request.path_params["name"]
            lab = runner.lab(name) if runner is not None else None
            if lab is None:
                raise PageError(404, f"There is no lab {name[:40]!r}.")
            return self._render(request, "lab.html", who, lab=lab, allowed=self._may_run_labs(who))

        return await self._page(request, build)

    async def lab_start(self, request: Request) -> Response:
        runner = self.config.labs
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if runner is None:
            return JSONResponse({"detail": "labs are off on this gateway (TENURE_UI_LABS=off)"}, 404)
        if not self._may_run_labs(who):
            return JSONResponse({"detail": "only the admin starts a lab (they start processes on this machine)"}, 403)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"detail": "the body is a JSON object of the lab's parameters"}, 422)
        try:
            run = await runner.start(request.path_params["name"], body)
        except LookupError as exc:
            return JSONResponse({"detail": str(exc)}, 404)
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        except RuntimeError as exc:
            return JSONResponse({"detail": str(exc)}, 409)
        return JSONResponse({"lab": run.name, "run": run.id, "params": run.params}, 202)

    async def lab_stop(self, request: Request) -> Response:
        runner = self.config.labs
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if runner is None or not self._may_run_labs(who):
            return JSONResponse({"detail": "no lab to stop"}, 404)
        stopped = await runner.stop(request.path_params["name"])
        return JSONResponse({"stopped": stopped})

    async def lab_events(self, request: Request) -> Response:
        runner = self.config.labs
        who = self._who(request)
        if who is None or runner is None or not self._may_run_labs(who):
            return JSONResponse({"detail": "not found"}, 404)
        return runner.stream(request.path_params["name"], request.headers.get("last-event-id"))


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


__all__ = ["Dashboard", "DashboardConfig", "epoch_history", "id_range", "throughput_chart"]
