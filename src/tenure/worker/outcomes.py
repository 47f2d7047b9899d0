"""What ends an execution and what its finish writes: `outcome_of`'s table (see `Execution.run`)."""

from __future__ import annotations

from dataclasses import dataclass

from tenure.contracts.errors import JobCancelled, OwnershipLost, PermanentError, TenureError
from tenure.contracts.states import JobState
from tenure.contracts.text import describe_error


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
