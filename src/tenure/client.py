"""`tenure.client.Client`: the async Python client of the gateway's HTTP API (httpx).

    async with Client("http://127.0.0.1:8000", api_key="...") as c:
        admitted = await c.submit("echo", {"hello": 1}, idempotency_key="req-42")
        async for event in c.stream(admitted.job):        # SSE; resumes from the last id after a disconnect
            print(event.type, event.payload)

It is a `JobsClient` (control/jobs.py), like `tenure.connect`'s `LocalClient`: both answer with the same types
(`Admitted`, `Job`, `Event`, `ControlOutcome`), so code runs against the gateway or the store unchanged. The
answers are read from JSON by the models that the gateway's OpenAPI document is derived from (control/models.py).
Errors come back as `GatewayError` with the HTTP status and the problem body (`type`, `title`, `detail`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from tenure.contracts.errors import InvalidRequest, TenureError
from tenure.contracts.states import JobState
from tenure.contracts.types import ControlOutcome, Event, Job
from tenure.control.admission import Admitted
from tenure.control.jobs import JobRef, JobsClient, ref_id
from tenure.control.json_input import MAX_JSON_DEPTH
from tenure.control.models import event_from_wire, job_from_wire

TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled", "job.lost", "job.expired", "job.dead"})
TERMINAL_STATES = frozenset(s.value for s in JobState if s.terminal)


class GatewayError(TenureError):
    """The gateway refused a request: `status` is the HTTP status, `problem` the JSON problem body."""

    code = "gateway_error"

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}".strip())
        self.status = status
        self.problem = problem


class Client:
    """An async client of one gateway. `url` defaults to TENURE_URL, `api_key` to TENURE_API_KEY."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = (url or os.environ.get("TENURE_URL") or "http://127.0.0.1:8000").rstrip("/")
        key = api_key if api_key is not None else os.environ.get("TENURE_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def _post_json(self, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self._call(
            "POST", path, content=_json_body(body), headers={"Content-Type": "application/json", **(headers or {})}
        )

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self._http.request(method, path, **kw)
        if r.status_code >= 400:
            try:
                problem = r.json()
            except ValueError:
                problem = {"title": r.reason_phrase, "detail": r.text[:200]}
            raise GatewayError(r.status_code, problem if isinstance(problem, dict) else {"detail": str(problem)})
        return r

    # -- jobs --------------------------------------------------------------------------------------------------------
    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        priority: int | None = None,
        requires: Sequence[str] | None = None,
        deadline_s: float | None = None,
        max_attempts: int | None = None,
        concurrency_key: str | None = None,
        multitask: str | None = None,
        mode: str | None = None,
        budget: Mapping[str, float] | None = None,
        prefers: Sequence[str] | None = None,
        strict: bool = False,
    ) -> Admitted:
        """Admit a job: the job (the original one when the idempotency key was seen: `created` is False). A
        `reject` job of a busy concurrency key is a `GatewayError` 409 whose problem names `running_job_id`."""
        body: dict[str, Any] = {"agent": agent, "input": input}
        for k, v in (
            ("priority", priority),
            ("requires", list(requires) if requires else None),
            ("deadline_s", deadline_s),
            ("max_attempts", max_attempts),
            ("concurrency_key", concurrency_key),
            ("multitask", multitask),
            ("mode", mode),
            ("budget", dict(budget) if budget is not None else None),
            ("prefers", list(prefers) if prefers else None),
            ("strict", True if strict else None),
        ):
            if v is not None:
                body[k] = v
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        r = await self._post_json("/v1/jobs", body, headers)
        return Admitted(job_from_wire(r.json()), r.status_code == 201)

    async def job(self, job_id: JobRef) -> Job:
        """One job (`GatewayError` 404 for no such job, or another tenant's)."""
        return job_from_wire((await self._call("GET", f"/v1/jobs/{ref_id(job_id)}")).json())

    async def result(self, job_id: JobRef) -> Any:
        """A succeeded job's result (`GET /v1/jobs/{id}/result`: inline or streamed from its artifact), read whole
        into memory; `GatewayError` 409 for a job in another state, 404 for no such job."""
        return (await self._call("GET", f"/v1/jobs/{ref_id(job_id)}/result")).json()

    async def jobs(
        self,
        *,
        state: JobState | str | None = None,
        agent: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> list[Job]:
        """The caller's jobs, newest first; `cursor` is the id of the last job of the previous page."""
        wanted = state.value if isinstance(state, JobState) else state
        params = {k: v for k, v in (("state", wanted), ("agent", agent), ("limit", limit), ("cursor", cursor)) if v}
        page = (await self._call("GET", "/v1/jobs", params=params)).json()
        return [job_from_wire(j) for j in page["jobs"]]

    async def cancel(self, job_id: JobRef, *, wait: float | None = None) -> ControlOutcome:
        """`requested`, `accepted` or `already_finished` (an unknown job raises GatewayError 404)."""
        params = {"wait": wait} if wait else {}
        return _outcome(await self._call("POST", f"/v1/jobs/{ref_id(job_id)}/cancel", params=params))

    async def send_input(self, job_id: JobRef, input: Any) -> ControlOutcome:
        """Send an input to a job waiting in `ctx.next_input()`."""
        return _outcome(await self._post_json(f"/v1/jobs/{ref_id(job_id)}/input", {"input": input}))

    async def approve(self, job_id: JobRef, approved: bool = True, comment: str | None = None) -> ControlOutcome:
        """Answer a job waiting in `ctx.approval(prompt)`."""
        body: dict[str, Any] = {"approved": approved}
        if comment is not None:
            body["comment"] = comment
        return _outcome(await self._post_json(f"/v1/jobs/{ref_id(job_id)}/approve", body))

    async def workers(self) -> list[dict[str, Any]]:
        """The registry as the gateway shows it (`jobs_held` is a count for a tenant, the ids for the admin)."""
        out: list[dict[str, Any]] = (await self._call("GET", "/v1/workers")).json()["workers"]
        return out

    async def wait(self, job_id: JobRef, timeout_s: float | None = None, poll_s: float = 0.1) -> Job:
        """Poll until the job is terminal (or raise TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.job(job_id)
                if job.state.terminal:
                    return job
                await asyncio.sleep(poll_s)

    # -- events ------------------------------------------------------------------------------------------------------
    async def events(self, job_id: JobRef, after: str | None = None, limit: int = 1000) -> list[Event]:
        """One page of the history after a cursor (`EPOCH-SEQ`)."""
        params: dict[str, Any] = {"format": "json", "limit": limit}
        if after:
            params["after"] = after
        page = (await self._call("GET", f"/v1/jobs/{ref_id(job_id)}/events", params=params)).json()
        return [event_from_wire(e) for e in page["events"]]

    async def stream(self, job_id: JobRef, after: str | None = None, *, reconnect: bool = True) -> AsyncIterator[Event]:
        """The job's events over SSE until its terminal event. After a dropped connection it reconnects with
        `Last-Event-ID` = the last id received, so the events it yields have no gap and no duplicate."""
        last, last_type = after, None
        while True:
            try:
                async for event in self._sse_once(ref_id(job_id), last):
                    last, last_type = event.cursor, event.type
                    yield event
                if last_type in TERMINAL_EVENTS or not reconnect:
                    return  # the server ends a stream after its terminal event
            except (httpx.TransportError, httpx.RemoteProtocolError):
                if not reconnect:
                    raise
            await asyncio.sleep(0.2)

    async def _sse_once(self, job_id: str, after: str | None) -> AsyncIterator[Event]:
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = after
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        async with self._http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                raise GatewayError(r.status_code, r.json())
            data: list[str] = []
            async for line in r.aiter_lines():
                if line == "":
                    if data:
                        yield event_from_wire(json.loads("\n".join(data)))
                        data = []
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


if TYPE_CHECKING:  # mypy holds Client to the one client shape

    def _is_a_jobs_client(client: Client) -> JobsClient:
        return client


def _outcome(r: httpx.Response) -> ControlOutcome:
    return ControlOutcome(r.json()["outcome"])


def _json_body(value: Any) -> bytes:
    """A request body as ASCII JSON. A str that is not Unicode text (a lone surrogate) goes out as its `\\u`
    escape and the gateway answers with its problem (400, raised as `GatewayError`), where httpx's UTF-8 encoding
    would raise a UnicodeEncodeError here; what cannot be JSON at all is refused before any request."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")
    except RecursionError:
        raise InvalidRequest(f"the request nests too deep for JSON (the gateway accepts {MAX_JSON_DEPTH} levels)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"the request is not JSON-serializable: {exc}") from None
