"""One WebSocket session: submit, subscribe with a cursor, cancel, input and approve on one socket.

Client frames are JSON objects with an `op` and an optional `ref` echoed in the answer:

    {"op": "submit", "ref": 1, "agent": "echo", "input": {...}, "idempotency_key": "k", "subscribe": true}
    {"op": "subscribe", "job_id": "...", "after": "1-42"}        {"op": "unsubscribe", "job_id": "..."}
    {"op": "cancel" | "input" | "approve", "job_id": "...", ...}  {"op": "ping"}

Server frames: `submitted`, `subscribed`, `event` (the event envelope), `end` (after the terminal event, or at
once for a finished job with nothing after the cursor; with the final `cursor` and `state`),
`cancel` / `input` / `approve` (with the outcome), `pong`, and `error` ({status, type, title, detail}) for a
request the gateway refuses; the socket stays open. Close codes: 1003 for a binary frame, 1008 for a client
that does not read (its queue of frames is full), 1009 for a frame over the size limit (the server's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.websockets import WebSocket

from tenure.contracts.errors import TenureError
from tenure.contracts.text import dumps
from tenure.contracts.types import ControlOutcome
from tenure.control.jobs import JobsService
from tenure.control.json_input import ENVELOPE_DEPTH, InvalidJSON, parse_json
from tenure.control.models import SubmitFrame, shown, validated
from tenure.gateway.auth import Principal
from tenure.gateway.problems import Problem, from_error
from tenure.gateway.requests import parse_cursor_param, parse_job_id, submit_request
from tenure.gateway.streams import EventHub

log = logging.getLogger("tenure.gateway.ws")


class SlowConsumer(Exception):
    """The client does not read its frames fast enough."""


class WsSession:
    """The state of one socket: its outgoing queue and its subscriptions."""

    def __init__(
        self,
        jobs: JobsService,
        hub: EventHub,
        ws: WebSocket,
        who: Principal,
        *,
        queue: int = 1000,
        max_subscriptions: int = 100,
    ) -> None:
        self.jobs = jobs
        self.hub = hub
        self.ws = ws
        self.who = who
        self.max_subscriptions = max_subscriptions
        self.out: asyncio.Queue[str] = asyncio.Queue(queue)
        self.subs: dict[str, asyncio.Task[None]] = {}
        self.done = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""
        self._tg: asyncio.TaskGroup | None = None

    def send(self, frame: dict[str, Any]) -> None:
        """Queue a frame for the client; a full queue closes the socket as a slow consumer."""
        try:
            self.out.put_nowait(dumps(frame))
        except asyncio.QueueFull:
            if not self.done.is_set():
                log.warning(
                    "closing a websocket (%s): slow consumer, %d frames unread",
                    self.who.tenant,
                    self.out.qsize(),
                )
            self.finish(1008, "slow consumer: the client is not reading its frames")

    def finish(self, code: int | None = None, reason: str = "") -> None:
        """End the session (with a close code the first time one is given)."""
        if code is not None and self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self.done.set()

    async def run(self) -> None:
        """Serve the socket until the client leaves or the session is finished."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            sender = tg.create_task(self._send_loop(), name="ws-send")
            receiver = tg.create_task(self._receive_loop(), name="ws-receive")
            await self.done.wait()
            for t in (sender, receiver, *self.subs.values()):
                t.cancel()
        if self.close_code is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(self.close_code, self.close_reason), 1.0)

    async def _send_loop(self) -> None:
        try:
            while True:
                await self.ws.send_text(await self.out.get())
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection went away while sending
            self.finish()

    async def _receive_loop(self) -> None:
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("text") is None:
                    self.finish(1003, "frames are JSON text")
                    return
                await self._handle(msg["text"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("websocket receive ended: %s", exc)
        self.finish()

    def _error(self, ref: Any, problem: Problem) -> None:
        self.send({"op": "error", "ref": ref, **problem.body()})

    async def _handle(self, text: str) -> None:
        try:
            # The same reader as HTTP bodies: a lone surrogate (even in `ref`, which is echoed back) or a deep
            # frame is refused here, before anything could fail to encode or recurse.
            frame = parse_json(text, "the frame", max_depth=ENVELOPE_DEPTH)
        except InvalidJSON as exc:
            self._error(None, from_error(exc))
            return
        ref = frame.get("ref") if isinstance(frame, dict) else None
        try:
            if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
                raise Problem(400, "Bad frame", 'a frame is a JSON object with an "op"', "bad-frame")
            await self._dispatch(frame["op"], frame, ref)
        except Problem as p:
            self._error(ref, p)
        except TenureError as exc:
            self._error(ref, from_error(exc))
        except Exception:
            # A bug must cost this frame, not the socket and every other stream on it (HTTP answers a 500).
            log.exception("unhandled error on a websocket frame")
            self._error(ref, Problem(500, "Internal error", "the gateway failed on this frame; it is logged", "internal"))

    async def _dispatch(self, op: str, frame: dict[str, Any], ref: Any) -> None:
        if op == "ping":
            self.send({"op": "pong", "ref": ref})
        elif op == "submit":
            await self._submit(frame, ref)
        elif op == "subscribe":
            self._subscribe(await self._job(frame), frame.get("after"), ref)
        elif op == "unsubscribe":
            job_id = frame.get("job_id")
            task = self.subs.pop(job_id, None) if isinstance(job_id, str) else None
            if task is not None:
                task.cancel()
            self.send({"op": "unsubscribed", "ref": ref, "job_id": job_id})
        elif op in ("cancel", "input", "approve"):
            job_id = frame.get("job_id")
            if not isinstance(job_id, str):
                raise Problem(400, "Bad frame", "job_id is required", "bad-frame")
            # The body of the HTTP route, validated by the same model (`{"input": ...}`, `{"approved", "comment"}`).
            body = {k: v for k, v in frame.items() if k not in ("op", "ref", "job_id")}
            tenant = self.who.tenant
            if op == "cancel":
                outcome = await self.jobs.cancel(job_id, tenant)
            elif op == "input":
                outcome = await self.jobs.send_input(job_id, body, tenant)
            else:
                outcome = await self.jobs.approve(job_id, body, tenant)
            if outcome is ControlOutcome.UNKNOWN:
                raise Problem(404, "Not found", f"no job {job_id}", "not-found", outcome=outcome.value)
            self.send({"op": op, "ref": ref, "job_id": job_id, "outcome": outcome.value})
        else:
            raise Problem(400, "Unknown op", f"unknown op {shown(op)}", "bad-frame")

    async def _job(self, frame: dict[str, Any]) -> str:
        job_id = frame.get("job_id")
        if not isinstance(job_id, str):
            raise Problem(400, "Bad frame", "job_id is required", "bad-frame")
        job = await self.jobs.job(parse_job_id(job_id), self.who.tenant)
        return job.id

    async def _submit(self, frame: dict[str, Any], ref: Any) -> None:
        spec = validated(SubmitFrame, frame, "a frame")
        admitted = await self.jobs.submit(submit_request(spec, self.who, spec.idempotency_key))
        self.send({"op": "submitted", "ref": ref, "created": admitted.created, "job": admitted.job.to_dict()})
        if spec.subscribe:
            self._subscribe(admitted.job.id, None, ref)

    def _subscribe(self, job_id: str, after: Any, ref: Any) -> None:
        cursor = None
        if after is not None:
            if not isinstance(after, str):
                raise Problem(400, "Bad cursor", "after is a cursor EPOCH-SEQ", "bad-cursor")
            cursor = parse_cursor_param(after, "after")
        if job_id in self.subs:
            self.subs.pop(job_id).cancel()
        if len(self.subs) >= self.max_subscriptions:
            raise Problem(429, "Too many subscriptions", "unsubscribe from a job first", "too-many-subscriptions")
        assert self._tg is not None
        sub = self.hub.subscribe(job_id, cursor)
        self.send({"op": "subscribed", "ref": ref, "job_id": job_id})

        async def pump() -> None:
            async for batch in sub.batches():
                for e in batch:
                    self.send({"op": "event", "job_id": job_id, "event": e.to_dict()})
            self.send(
                {
                    "op": "end",
                    "job_id": job_id,
                    "cursor": None if sub.cursor is None else f"{sub.cursor[0]}-{sub.cursor[1]}",
                    "state": sub.final_state,
                }
            )
            if self.subs.get(job_id) is asyncio.current_task():
                del self.subs[job_id]

        self.subs[job_id] = self._tg.create_task(pump(), name=f"ws-sub-{job_id}")
