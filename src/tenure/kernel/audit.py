"""What a handler records in its job's audit (docs/audit.md): `ToolCall`, the block `ctx.tool_call` returns.

    async with ctx.tool_call("search", {"q": "tenure"}) as call:
        hits = await search("tenure")
        call.result(hits)

Nothing is written when the block starts; when it ends, one record (name, arguments, result or error, start,
end, duration on the worker's clock) joins the execution's next batch of events, fenced like them. An exception
inside the block is recorded as the call's error and goes on (the block never swallows it).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from tenure.contracts.errors import OwnershipLost
from tenure.contracts.text import describe_error, dumps


class JournalPort(Protocol):
    """What the worker provides to one execution for its audit records and journal steps (worker/audit.py)."""

    async def audit(
        self, kind: str, name: str, data_json: str, started_at: float | None, ended_at: float | None, durable: bool
    ) -> None:
        """Queue one audit record (fenced, written with the events); `durable`: wait until it is written."""
        ...

    async def step(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run `fn(*args)` at most once per job and key, its JSON result journaled before returning."""
        ...

    async def resolve_step(self, key: str, result_json: str) -> None:
        """Record the result of a step an earlier attempt began and never ended (the handler's decision)."""
        ...

    def record_external(self, kind: str, seconds: float) -> None:
        """Time one external call (`tenure_external_seconds`)."""
        ...

    async def checkpoint(self) -> None:
        """Raise `BudgetExhausted` when the job has reached a limit of its budget (before new work starts)."""
        ...


def _json_or_repr(value: Any) -> Any:
    """`value` when it is storable JSON, else its repr (an audit record never fails a handler over its result)."""
    try:
        dumps(value)
    except (TypeError, ValueError, RecursionError):
        return {"unserializable": describe_error(Exception(repr(value)[:2000]))}
    return value


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ValueError(f"{what} is a string of 1 to 200 characters, not {name!r}")
    return name


class ToolCall:
    """One tool call of an execution, as an `async with` block (see the module docstring)."""

    __slots__ = ("_args", "_ended", "_name", "_port", "_result", "_started", "_wall", "has_result")

    def __init__(self, port: JournalPort, name: str, args: Any) -> None:
        self._port = port
        self._name = check_name(name, "a tool call's name")
        dumps(args)  # arguments no store can hold are refused before the call runs
        self._args = args
        self._result: Any = None
        self.has_result = False
        self._started = self._wall = self._ended = 0.0

    def result(self, value: Any) -> None:
        """The call's result, recorded when the block ends."""
        self._result = value
        self.has_result = True

    async def __aenter__(self) -> ToolCall:
        await self._port.checkpoint()  # a job out of budget makes no more calls (docs/budgets.md)
        self._started = time.time()
        self._wall = time.monotonic()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        duration = time.monotonic() - self._wall
        ended = self._started + duration
        self._port.record_external("tool", duration)
        data: dict[str, Any] = {"arguments": self._args}
        if exc is None:
            data["result"] = _json_or_repr(self._result)
        else:
            data["error"] = "cancelled" if isinstance(exc, asyncio.CancelledError) else describe_error(exc)
        try:
            await self._port.audit("tool_call", self._name, dumps(data), self._started, ended, False)
        except OwnershipLost:
            if exc is None:
                raise
        return False


def tool(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a tool function record each of its calls in the job's audit, like `ctx.tool_call`:

        @tenure.tool()
        async def search(ctx: tenure.Context, q: str) -> list[str]: ...

        hits = await search(ctx, "tenure")   # one tool_call record: name "search", arguments {"q": "tenure"}

    The function takes the handler's `ctx` first; its other arguments (by name, JSON) are the record's arguments
    and its return value the result. A plain function runs through the blocking adapter (`ctx.to_thread`)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = check_name(name or fn.__name__, "a tool's name")
        signature = inspect.signature(fn)
        is_async = inspect.iscoroutinefunction(fn)

        @functools.wraps(fn)
        async def call(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(ctx, *args, **kwargs)
            arguments = {k: v for i, (k, v) in enumerate(bound.arguments.items()) if i > 0}
            async with ctx.tool_call(tool_name, arguments) as record:
                result = await fn(ctx, *args, **kwargs) if is_async else await ctx.to_thread(fn, ctx, *args, **kwargs)
                record.result(result)
            return result

        return call

    return decorate
