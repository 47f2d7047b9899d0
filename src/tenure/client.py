"""`tenure.client.Client`: the async Python client of the gateway's HTTP API (httpx).

    async with Client("http://127.0.0.1:8000", api_key="...") as c:
        job = await c.submit("echo", {"hello": 1}, idempotency_key="req-42")
        async for event in c.stream(job["id"]):          # SSE; resumes from the last id after a disconnect
            print(event["type"], event["payload"])

Errors come back as `GatewayError` with the HTTP status and the problem body (`type`, `title`, `detail`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tenure.contracts.errors import InvalidRequest, TenureError
from tenure.control.admission import MAX_JSON_DEPTH

TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled", "job.lost", "job.expired", "job.dead"})
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost", "expired", "dead"})


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
        requires: list[str] | None = None,
        deadline_s: float | None = None,
        max_attempts: int | None = None,
    ) -> dict[str, Any]:
        """Admit a job; returns the job (the original one when the idempotency key was seen)."""
        body: dict[str, Any] = {"agent": agent, "input": input}
        for k, v in (
            ("priority", priority),
            ("requires", requires),
            ("deadline_s", deadline_s),
            ("max_attempts", max_attempts),
        ):
            if v is not None:
                body[k] = v
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        r = await self._post_json("/v1/jobs", body, headers)
        job: dict[str, Any] = r.json()
        job["_created"] = r.status_code == 201
        return job

    async def job(self, job_id: str) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/jobs/{job_id}")
        out: dict[str, Any] = r.json()
        return out

    async def jobs(
        self,
        *,
        state: str | None = None,
        agent: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        params = {k: v for k, v in (("state", state), ("agent", agent), ("limit", limit), ("cursor", cursor)) if v}
        out: dict[str, Any] = (await self._call("GET", "/v1/jobs", params=params)).json()
        return out

    async def cancel(self, job_id: str, *, wait: float | None = None) -> str:
        """`requested`, `accepted` or `already_finished` (an unknown job raises GatewayError 404)."""
        params = {"wait": wait} if wait else {}
        return str((await self._call("POST", f"/v1/jobs/{job_id}/cancel", params=params)).json()["outcome"])

    async def send_input(self, job_id: str, input: Any) -> str:
        return str((await self._post_json(f"/v1/jobs/{job_id}/input", {"input": input})).json()["outcome"])

    async def approve(self, job_id: str, approved: bool = True, comment: str | None = None) -> str:
        body: dict[str, Any] = {"approved": approved}
        if comment is not None:
            body["comment"] = comment
        return str((await self._post_json(f"/v1/jobs/{job_id}/approve", body)).json()["outcome"])

    async def workers(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = (await self._call("GET", "/v1/workers")).json()["workers"]
        return out

    async def wait(self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.1) -> dict[str, Any]:
        """Poll until the job is terminal."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.job(job_id)
                if job["state"] in TERMINAL_STATES:
                    return job
                await asyncio.sleep(poll_s)

    # -- events ------------------------------------------------------------------------------------------------------
    async def events(self, job_id: str, after: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """One page of the history after a cursor (`EPOCH-SEQ`)."""
        params: dict[str, Any] = {"format": "json", "limit": limit}
        if after:
            params["after"] = after
        out: list[dict[str, Any]] = (await self._call("GET", f"/v1/jobs/{job_id}/events", params=params)).json()["events"]
        return out

    async def stream(
        self, job_id: str, after: str | None = None, *, reconnect: bool = True
    ) -> AsyncIterator[dict[str, Any]]:
        """The job's events over SSE until its terminal event. After a dropped connection it reconnects with
        `Last-Event-ID` = the last id received, so the events it yields have no gap and no duplicate."""
        last, last_type = after, None
        while True:
            try:
                async for event in self._sse_once(job_id, last):
                    last, last_type = event["id"], event["type"]
                    yield event
                if last_type in TERMINAL_EVENTS or not reconnect:
                    return  # the server ends a stream after its terminal event
            except (httpx.TransportError, httpx.RemoteProtocolError):
                if not reconnect:
                    raise
            await asyncio.sleep(0.2)

    async def _sse_once(self, job_id: str, after: str | None) -> AsyncIterator[dict[str, Any]]:
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
                        yield json.loads("\n".join(data))
                        data = []
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


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
