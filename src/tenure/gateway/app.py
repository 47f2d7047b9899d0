"""The ASGI gateway: jobs over HTTP, WebSocket and SSE. It never owns an execution.

    POST /v1/jobs                 admit a job (Idempotency-Key header)     201 new, 200 replay
    GET  /v1/jobs                 list (state, agent, limit, cursor)
    GET  /v1/jobs/{id}            one job
    POST /v1/jobs/{id}/cancel     requested | accepted | already_finished  (unknown → 404)
    POST /v1/jobs/{id}/input      persisted, then delivered to the owner
    POST /v1/jobs/{id}/approve    persisted, then delivered to the owner
    GET  /v1/jobs/{id}/events     SSE (Last-Event-ID) or JSON history (?format=json&after=)
    GET  /v1/jobs/{id}/result     the result, streamed (inline or its artifact); GET /v1/artifacts/{ref}
    WS   /v1/ws                   submit, subscribe with a cursor, cancel, input, approve on one socket
    GET  /v1/workers, /healthz, /readyz, /openapi.json; POST /v1/workers/{id}/drain (admin)

Every request is scoped to the caller's tenant: another tenant's job is answered like a missing one (404).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from tenure.contracts.errors import ArtifactsUnavailable, TenureError
from tenure.contracts.ready import ReadyIndex
from tenure.contracts.states import JobState
from tenure.contracts.store import Backends
from tenure.contracts.text import dumps
from tenure.contracts.types import AgentSpec, ControlOutcome, Job, JobFilter, is_uuid
from tenure.control.admission import Admission, AdmissionLimits
from tenure.control.audit import AUDIT_CURSOR, DEFAULT_PAGE, MAX_PAGE, job_audit, usage_report
from tenure.control.gate import GateConfig
from tenure.control.jobs import MAX_WAIT_S, JobsService
from tenure.control.json_input import ENVELOPE_DEPTH, parse_json
from tenure.control.models import JobSpec, shown, validated
from tenure.gateway.artifacts import artifact_response, result_response
from tenure.gateway.auth import Auth, Principal
from tenure.gateway.cors import AccessToken, access_token, cors_middleware
from tenure.gateway.family import family_sse
from tenure.gateway.openapi import MAX_EVENTS_PAGE, MAX_LIST, openapi_document
from tenure.gateway.problems import Problem, from_error
from tenure.gateway.requests import int_param, parse_cursor_param, parse_job_id, submit_request
from tenure.gateway.streams import EventHub
from tenure.gateway.ws import WsSession
from tenure.observability import metrics
from tenure.observability.exposition import metrics_asgi_app

log = logging.getLogger("tenure.gateway")


class SessionCheck(Protocol):
    """The dashboard's cookie sessions as the API sees them (gateway/ui/sessions.py implements it)."""

    def principal(self, request: Request, method: str) -> Principal | None:
        """The caller a request's session cookie names, if it is valid (and, for a change, carries its token)."""
        ...


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """How one gateway process behaves."""

    limits: AdmissionLimits = field(default_factory=AdmissionLimits)
    gate: GateConfig = field(default_factory=GateConfig)
    sse_idle_s: float = 5.0  # keep-alive comment, and the floor for a lost live notice
    ws_queue: int = 1000  # frames queued for one socket before it is closed as a slow consumer
    ws_max_subscriptions: int = 100
    cors_origins: tuple[str, ...] = ()  # TENURE_CORS_ORIGINS: exact origins allowed to call from a browser

    @property
    def max_body_bytes(self) -> int:
        """A request body may carry the largest admissible input plus the other fields."""
        return self.limits.max_input_bytes + 64 * 1024


def _job_view(job: Job) -> dict[str, Any]:
    return job.to_dict()


class _AsgiEndpoint:
    """Starlette calls a Route's endpoint as an ASGI app when it is not a plain function or method."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


class Gateway:
    """The gateway's state (one per process) and its Starlette app (`.asgi`)."""

    def __init__(
        self,
        backends: Backends,
        agents: Mapping[str, AgentSpec],
        auth: Auth | None = None,
        config: GatewayConfig | None = None,
        *,
        on_start: Callable[[], Awaitable[None]] | None = None,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        ready_index: ReadyIndex | None = None,
    ) -> None:
        store = self.store = backends.jobs
        self.artifacts = backends.artifacts  # results and evidence by reference (gateway/artifacts.py)
        self.config = config or GatewayConfig()
        self.auth = auth or Auth.open()
        # The one admission door (the CLI and tenure.connect use the same); with a ready index
        # (TENURE_REDIS_URL), a job submitted here is hinted to the workers at once.
        self.admission = Admission(
            store, agents, self.config.limits, ready_index, gate=self.config.gate, on_gate=self._gate_checked,
            on_degraded=lambda agent, reason: metrics.DEGRADED.labels(agent, reason).inc(),
        )  # fmt: skip
        self.jobs = JobsService(store, self.admission)
        self._openapi: dict[str, Any] | None = None
        self.hub = EventHub(store, backends.signals, self.config.sse_idle_s)
        self._on_start = on_start
        self._on_stop = on_stop
        self.sessions: SessionCheck | None = None  # the dashboard's cookie sessions, once mounted (mount_ui)
        metrics.QUEUE_CAPACITY.labels("global").set(self.config.gate.max_queued)
        routes = [
            Route("/v1/jobs", self.submit, methods=["POST"]),
            Route("/v1/jobs", self.list_jobs, methods=["GET"]),
            Route("/v1/jobs/{job_id}", self.get_job, methods=["GET"]),
            Route("/v1/jobs/{job_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/jobs/{job_id}/input", self.send_input, methods=["POST"]),
            Route("/v1/jobs/{job_id}/approve", self.approve, methods=["POST"]),
            Route("/v1/jobs/{job_id}/events", self.events, methods=["GET"]),
            Route("/v1/jobs/{job_id}/audit", self.audit, methods=["GET"]),
            Route("/v1/jobs/{job_id}/requeue", self.requeue, methods=["POST"]),
            Route("/v1/jobs/{job_id}/result", self.result, methods=["GET"]),
            Route("/v1/artifacts/{ref}", self.artifact, methods=["GET"]),
            Route("/v1/usage", self.usage, methods=["GET"]),
            Route("/v1/workers", self.workers, methods=["GET"]),
            Route("/v1/workers/{worker_id}/drain", self.drain_worker, methods=["POST"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            WebSocketRoute("/v1/ws", self.websocket),
            # Prometheus: this process, or every process of `tenure up` (PROMETHEUS_MULTIPROC_DIR). A Route
            # (not a Mount, which answers the bare path with a redirect) whose endpoint is an ASGI object.
            Route("/metrics", _AsgiEndpoint(metrics_asgi_app()), methods=["GET"]),
        ]
        self.asgi = Starlette(
            routes=routes,
            exception_handlers={
                Problem: self._problem,
                HTTPException: self._http_error,
                TenureError: self._tenure_error,
                Exception: self._crash,
            },
            lifespan=self._lifespan,
            # `?access_token=` leaves the URL before anything sees it; CORS only for TENURE_CORS_ORIGINS (cors.py).
            middleware=[*cors_middleware(self.config.cors_origins), Middleware(AccessToken)],
        )

    def mount_ui(self, routes: list[BaseRoute], sessions: SessionCheck) -> None:
        """Serve the dashboard's routes (gateway/ui) beside the API; its session cookie then also authenticates
        the API requests its own pages make (same origin, with the CSRF token for changes)."""
        self.sessions = sessions
        self.asgi.router.routes.extend(routes)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        async with asyncio.TaskGroup() as tg:
            hub = tg.create_task(self.hub.run(), name="event-hub")
            if self._on_start is not None:
                await self._on_start()
            try:
                yield
            finally:
                if self._on_stop is not None:
                    await self._on_stop()
                hub.cancel()

    # -- errors ------------------------------------------------------------------------------------------------------
    async def _problem(self, _request: Any, exc: Exception) -> Response:
        assert isinstance(exc, Problem)
        return exc.response()

    async def _http_error(self, _request: Any, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return Problem(exc.status_code, str(exc.detail), f"{exc.detail}", kind).response()

    async def _tenure_error(self, request: Any, exc: Exception) -> Response:
        assert isinstance(exc, TenureError)
        if isinstance(exc, ArtifactsUnavailable):  # the client gets a 503 without the bucket's address: it goes here
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        return from_error(exc).response()

    async def _crash(self, _request: Any, exc: Exception) -> Response:
        log.error("unhandled error in the gateway", exc_info=exc)
        return Problem(500, "Internal error", "the gateway failed on this request; it is logged", "internal").response()

    # -- helpers -----------------------------------------------------------------------------------------------------
    def _principal(self, request: Request, *, token: bool = False) -> Principal:
        header = request.headers.get("authorization")
        if header is None and token and (key := access_token(request.scope)) is not None:
            header = f"Bearer {key}"  # a stream a browser opened (EventSource cannot send headers)
        p = self.auth.authenticate(header)
        if p is None and header is None and self.sessions is not None:
            p = self.sessions.principal(request, request.method)
        if p is None:
            prob = Problem(401, "Unauthorized", "send Authorization: Bearer <API key>", "unauthorized")
            prob.headers["WWW-Authenticate"] = 'Bearer realm="tenure"'
            raise prob
        return p

    async def _body(self, request: Request) -> Any:
        limit = self.config.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not (length.isascii() and length.isdigit()) or int(length) > limit):
            raise Problem(413, "Body too large", f"the request body is over {limit} bytes", "body-too-large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Problem(413, "Body too large", f"the request body is over {limit} bytes", "body-too-large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise Problem(400, "Missing body", "this endpoint needs a JSON body", "bad-json")
        return parse_json(raw, "the body", max_depth=ENVELOPE_DEPTH)  # InvalidJSON: 400 (problems.from_error)

    def _gate_checked(self, tenant: str, circuit_key: str, circuit_open: bool) -> None:
        # The caps this gateway admits under, beside the depth the sweeper exports (queue alerts).
        metrics.QUEUE_CAPACITY.labels(tenant).set(self.config.gate.max_queued_per_tenant)
        metrics.CIRCUIT_STATE.labels(circuit_key).set(2 if circuit_open else 0)

    async def load_job(self, job_id: str, who: Principal) -> Job:
        """The job `job_id` as `who` may see it, else a 404 problem."""
        return await self.jobs.job(parse_job_id(job_id), who.tenant)

    # -- HTTP --------------------------------------------------------------------------------------------------------
    async def submit(self, request: Request) -> Response:
        """POST /v1/jobs: admit a job through the one door; 201 with the job, 200 for a replayed key."""
        who = self._principal(request)
        spec = validated(JobSpec, await self._body(request))
        admitted = await self.jobs.submit(submit_request(spec, who, request.headers.get("idempotency-key")))
        headers = {"Location": f"/v1/jobs/{admitted.job.id}"}
        return JSONResponse(_job_view(admitted.job), 201 if admitted.created else 200, headers=headers)

    async def list_jobs(self, request: Request) -> Response:
        """GET /v1/jobs: the caller's jobs, newest first, a page at a time."""
        who = self._principal(request)
        q = request.query_params
        state = None
        if q.get("state"):
            try:
                state = JobState(q["state"])
            except ValueError:
                raise Problem(400, "Bad parameter", f"unknown state {shown(q['state'])}", "bad-parameter") from None
        cursor = q.get("cursor") or None
        if cursor is not None and not is_uuid(cursor):
            raise Problem(400, "Bad cursor", "cursor is the id of the last job of the previous page", "bad-cursor")
        agent = q.get("agent") or None
        if agent is not None and "\x00" in agent:  # PostgreSQL text cannot hold it: the store would fail (503)
            raise Problem(400, "Bad parameter", "agent must not contain U+0000 (NUL)", "bad-parameter")
        limit = int_param(request, "limit", 50, 1, MAX_LIST)
        jobs = await self.jobs.jobs(JobFilter(who.tenant, state, agent, cursor, limit))
        nxt = jobs[-1].id if len(jobs) == limit else None
        return JSONResponse({"jobs": [_job_view(j) for j in jobs], "next_cursor": nxt})

    async def get_job(self, request: Request) -> Response:
        """GET /v1/jobs/{id}: one job."""
        who = self._principal(request)
        job = await self.load_job(request.path_params["job_id"], who)
        job = dataclasses.replace(job, children=tuple(await self.jobs.children(job)))  # docs/coordinators.md
        return JSONResponse(
            _job_view(job) | {"waiting_reason": await self.jobs.waiting_reason(job), "route": await self.jobs.route(job)}
        )

    async def result(self, request: Request) -> Response:
        """GET /v1/jobs/{id}/result: the result's JSON, streamed from its artifact when it has one."""
        job = await self.load_job(request.path_params["job_id"], self._principal(request))
        return await result_response(request, self.artifacts, job)

    async def artifact(self, request: Request) -> Response:
        """GET /v1/artifacts/{ref}: one artifact of a job the caller may see, streamed."""
        who = self._principal(request)
        return await artifact_response(request, self.artifacts, lambda job_id: self.load_job(job_id, who))

    async def audit(self, request: Request) -> Response:
        """GET /v1/jobs/{id}/audit: the job's executions, tool calls, evidence, usage and journal (docs/audit.md)."""
        who = self._principal(request)
        limit = int_param(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        job_id, cursor = parse_job_id(request.path_params["job_id"]), request.query_params.get("cursor")
        if cursor and not AUDIT_CURSOR.match(cursor):
            raise Problem(400, "Bad cursor", "cursor is the next_cursor of the previous page (EPOCH.SEQ)", "bad-cursor")
        return JSONResponse(await job_audit(self.jobs, job_id, who.tenant, cursor, limit))

    async def requeue(self, request: Request) -> Response:
        """POST /v1/jobs/{id}/requeue: a finished, unsuccessful job back in the queue, its input edited if the
        body has `input` (docs/http-api.md)."""
        who = self._principal(request)
        body = await self._body(request) if request.headers.get("content-length", "0") != "0" else None
        job = await self.jobs.requeue(parse_job_id(request.path_params["job_id"]), who.tenant, body)
        return JSONResponse(_job_view(job))

    async def usage(self, request: Request) -> Response:
        """GET /v1/usage?from=&to=&group_by=: the caller's usage records summed per tenant, agent or model."""
        who = self._principal(request)
        q = request.query_params
        bounds = [_epoch(q.get(name), name) for name in ("from", "to")]
        report = await usage_report(self.jobs, who.tenant, bounds[0], bounds[1], q.get("group_by") or "tenant")
        return JSONResponse(report)

    async def _control_response(
        self, request: Request, kind: str, send: Callable[[str, str | None], Awaitable[ControlOutcome]]
    ) -> Response:
        job_id = request.path_params["job_id"]
        outcome = await send(job_id, self._principal(request).tenant)
        if outcome is ControlOutcome.UNKNOWN:
            raise Problem(404, "Not found", f"no job {job_id}", "not-found", outcome=outcome.value)
        if kind != "cancel" and outcome is ControlOutcome.ALREADY_FINISHED:
            raise Problem(
                409,
                "Job finished",
                f"job {job_id} is finished; nothing was sent",
                "already-finished",
                outcome=outcome.value,
            )
        status = 202 if outcome is ControlOutcome.REQUESTED else 200
        return JSONResponse({"job_id": parse_job_id(job_id), "command": kind, "outcome": outcome.value}, status)

    async def cancel(self, request: Request) -> Response:
        """POST /v1/jobs/{id}/cancel[?wait=]: cancel, or ask the owner to."""
        self._principal(request)
        wait_text = request.query_params.get("wait")
        wait_s = _float(wait_text, "wait") if wait_text else 0.0  # checked before anything is written
        return await self._control_response(request, "cancel", lambda jid, tenant: self.jobs.cancel(jid, tenant, wait_s))

    async def send_input(self, request: Request) -> Response:
        """POST /v1/jobs/{id}/input: persist an input, then signal the owner."""
        self._principal(request)
        body = await self._body(request)
        return await self._control_response(request, "input", lambda jid, tenant: self.jobs.send_input(jid, body, tenant))

    async def approve(self, request: Request) -> Response:
        """POST /v1/jobs/{id}/approve: persist an approval, then signal the owner."""
        self._principal(request)
        body = await self._body(request) if request.headers.get("content-length", "0") != "0" else {}
        return await self._control_response(request, "approve", lambda jid, tenant: self.jobs.approve(jid, body, tenant))

    async def events(self, request: Request) -> Response:
        """GET /v1/jobs/{id}/events: SSE (history, then the live tail) or, with format=json, one page."""
        who = self._principal(request, token=True)
        job = await self.load_job(request.path_params["job_id"], who)
        q = request.query_params
        after_text = q.get("after")
        after = parse_cursor_param(after_text, "after") if after_text else None
        if q.get("include") not in (None, "children") or (q.get("include") and q.get("format") == "json"):
            raise Problem(400, "Bad parameter", "include is children, on the SSE stream only", "bad-parameter")
        if q.get("format") == "json":
            limit = int_param(request, "limit", 1000, 1, MAX_EVENTS_PAGE)
            events = await self.store.read_events(job.id, after, limit)
            nxt = events[-1].cursor if events else (after_text or None)
            return JSONResponse(
                {
                    "job_id": job.id,
                    "events": [e.to_dict() for e in events],
                    "next": nxt,
                    "state": job.state.value,
                }
            )
        if q.get("format") not in (None, "sse"):
            raise Problem(400, "Bad parameter", "format is json or sse", "bad-parameter")
        last_id = request.headers.get("last-event-id")
        if last_id:
            after = parse_cursor_param(last_id.strip(), "Last-Event-ID")
        # A finished job with nothing after the cursor (a reconnect at or past its terminal event): 204, the HTML
        # standard's "stop reconnecting". Otherwise EventSource reconnects after every finished stream and holds
        # a connection of keep-alives forever. The job was read before the events, so a terminal event appended
        # between the two reads is seen here, and a requeue after them is found by the next request.
        if job.state.terminal and not await self.store.read_events(job.id, after, 1):
            return Response(status_code=204, headers={"Cache-Control": "no-cache"})
        if q.get("include") == "children":  # a coordinator's stream with its children's (docs/coordinators.md)
            return StreamingResponse(family_sse(self.hub, job.id, after), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        sub = self.hub.subscribe(job.id, after)

        async def stream() -> AsyncIterator[str]:
            yield ": stream of job " + job.id + "\n\n"
            async for batch in sub.batches():
                if not batch:
                    yield ": keep-alive\n\n"
                    continue
                yield "".join(f"id: {e.cursor}\nevent: {e.type}\ndata: {dumps(e.to_dict())}\n\n" for e in batch)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def workers(self, request: Request) -> Response:
        """GET /v1/workers: the registry (a tenant sees counts of jobs held, the admin their ids)."""
        who = self._principal(request)
        out = []
        for w in await self.store.list_workers():
            d = w.to_dict()
            if not who.is_admin:
                d["jobs_held"] = len(w.jobs_held)  # job ids of every tenant are the admin's to see
            out.append(d)
        return JSONResponse({"workers": out})

    async def drain_worker(self, request: Request) -> Response:
        """POST /v1/workers/{id}/drain (admin key; optional body `{"timeout_s": S}`): ask a live worker to drain
        at its next heartbeat (docs/routing.md); 202 with the worker as the registry now shows it."""
        who = self._principal(request)
        body = await self._body(request) if request.headers.get("content-length", "0") != "0" else {}
        if not who.is_admin:  # after the body: a malformed one is refused alike for everyone (400)
            raise Problem(403, "Forbidden", "draining a worker needs the admin key", "forbidden")
        if not isinstance(body, dict) or set(body) - {"timeout_s"}:
            raise Problem(422, "Invalid request", 'the body is optional: {"timeout_s": seconds}', "invalid-request")
        drained = await self.jobs.drain_worker(request.path_params["worker_id"], body.get("timeout_s"))
        return JSONResponse(drained.to_dict(), 202)

    async def healthz(self, _request: Request) -> Response:
        """GET /healthz: the process is up."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, _request: Request) -> Response:
        """GET /readyz: the store answers."""
        try:
            await asyncio.wait_for(self.store.server_time(), 2.0)
        except (TenureError, TimeoutError) as exc:
            raise Problem(503, "Not ready", f"the store does not answer: {exc}", "not-ready") from None
        return JSONResponse({"status": "ready", "subscribers": self.hub.subscribers})

    async def openapi(self, _request: Request) -> Response:
        """GET /openapi.json: the document derived from the models (built once per process)."""
        if self._openapi is None:
            self._openapi = openapi_document(sorted(self.admission.agents))
        return JSONResponse(self._openapi)

    # -- WebSocket ---------------------------------------------------------------------------------------------------
    async def websocket(self, ws: WebSocket) -> None:
        """WS /v1/ws: authenticate, then hand the socket to a `WsSession`."""
        token = access_token(ws.scope)
        header = ws.headers.get("authorization") or (f"Bearer {token}" if token else None)
        who = self.auth.authenticate(header)
        if who is None:
            await ws.close(code=1008, reason="unauthorized")  # before accept: the upgrade is refused (403)
            return
        await ws.accept()
        cfg = self.config
        await WsSession(self.jobs, self.hub, ws, who, queue=cfg.ws_queue, max_subscriptions=cfg.ws_max_subscriptions).run()


def _epoch(text: str | None, name: str) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise Problem(400, "Bad parameter", f"{name} is a time in epoch seconds", "bad-parameter") from None


def _float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise Problem(400, "Bad parameter", f"{name} must be a number of seconds", "bad-parameter") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise Problem(400, "Bad parameter", f"{name} must be from 0 to {MAX_WAIT_S:g}", "bad-parameter")
    return value


__all__ = ["Gateway", "GatewayConfig"]
