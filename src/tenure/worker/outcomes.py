"""What ends an execution and what its finish writes: `outcome_of`'s table (see `Execution.run`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenure.contracts.errors import HandlerAborted, JobCancelled, OwnershipLost, PermanentError, TenureError
from tenure.contracts.states import JobState
from tenure.contracts.text import describe_error, dumps
from tenure.kernel.blocking import BlockingAdapter
from tenure.kernel.context import Context
from tenure.kernel.registry import Agent


# -- what an end writes ------------------------------------------------------------------------------------------
class HandlerTimeout(Exception):
    """The handler ran past its hard timeout (and was stopped, or abandoned when it ignored that)."""

    def __init__(self, timeout_s: float | None, stopped: bool, grace_s: float) -> None:
        text = "the handler ran longer than " + ("its timeout" if timeout_s is None else f"{timeout_s:.6g}s")
        if not stopped:
            text += f" and ignored its cancellation for {grace_s:g}s (abandoned)"
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an execution ends: `state` CANCELLED or FAILED as is, or SCHEDULED for "retry after a backoff while
    attempts remain, else dead"."""

    state: JobState
    code: str
    message: str


# The table: what ended the handler → what its finish writes. First match wins; OwnershipLost writes nothing
# (the job is someone else's now). `None` as the code means the error's own `code`.
_OUTCOMES: tuple[tuple[type[Exception], JobState | None, str | None], ...] = (
    (OwnershipLost, None, None),
    (JobCancelled, JobState.CANCELLED, "cancelled"),
    (HandlerTimeout, JobState.SCHEDULED, "timeout"),
    (PermanentError, JobState.FAILED, None),
    (TenureError, JobState.SCHEDULED, None),  # RetryableError, HandlerAborted, a lost quota lease, ...
    (Exception, JobState.SCHEDULED, "error"),
)


def outcome_of(exc: Exception) -> Outcome | None:
    """The outcome of a handler that raised `exc` (None: write nothing)."""
    for kind, state, code in _OUTCOMES:
        if isinstance(exc, kind):
            if state is None:
                return None
            if state is JobState.CANCELLED:
                return Outcome(state, "cancelled", "cancelled")
            text = describe_error(exc)
            if isinstance(exc, PermanentError | HandlerTimeout):
                text = text.partition(": ")[2] or text  # its message says it all
            return Outcome(state, code or str(getattr(exc, "code", "error")), text)
    raise AssertionError("unreachable: Exception matches the last row")


# -- what a handler's call ends with ------------------------------------------------------------------------------
async def call_handler(agent: Agent, ctx: Context, payload: Any, adapter: BlockingAdapter) -> Any:
    """The handler's call. The three exceptions that are not `Exception`s become one here: asyncio re-raises
    SystemExit and KeyboardInterrupt out of any task into the event loop (ending the process), and GeneratorExit
    would end the execution's task without its finish."""
    try:
        if agent.is_async:
            return await agent.handler(ctx, payload)
        return await adapter.run(agent.handler, ctx, payload)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise HandlerAborted(describe_error(exc)) from None


def encode_result(result: Any) -> str:
    """A handler's result as the JSON its finish stores; one no store can hold fails the job (permanently)."""
    try:
        return dumps(result)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PermanentError(f"the result cannot be stored: {describe_error(exc)}") from exc
