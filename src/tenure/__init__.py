"""Tenure: a runtime for AI-agent jobs.

from tenure import Tenure, Context

app = Tenure()

@app.agent("echo")
async def echo(ctx: Context, input: dict) -> dict:
    await ctx.emit("message.delta", {"text": "hi"})
    return input

An agent module imports only what an agent author writes with (the app, its Context, the errors and types): the
client side (`connect`, `LocalClient`, the admission's answers) is loaded on first use (PEP 562), so importing
`tenure` loads no database or Redis driver.
"""

import typing as _typing

from tenure.contracts.errors import (
    BudgetExhausted,
    ChildFailed,
    ConfigError,
    HandlerAborted,
    IdempotencyConflict,
    InputTooLarge,
    InvalidRequest,
    JobCancelled,
    LeaseLost,
    NotFound,
    OwnershipLost,
    PermanentError,
    QuotaExhausted,
    QuotaUnavailable,
    RetryableError,
    StepUnknown,
    StoreUnavailable,
    TenureError,
    UnknownAgent,
)
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import Event, Job
from tenure.kernel.audit import tool
from tenure.kernel.children import ChildHandle
from tenure.kernel.context import Context
from tenure.kernel.registry import Tenure

if _typing.TYPE_CHECKING:
    from tenure.control.admission import Admitted, JobRequest
    from tenure.control.gate import CircuitOpen, QueueFull
    from tenure.control.jobs import JobsClient
    from tenure.local import LocalClient, connect

# The client side, loaded on first use: name -> module.
_LAZY = {
    "Admitted": "tenure.control.admission",
    "JobRequest": "tenure.control.admission",
    "CircuitOpen": "tenure.control.gate",
    "QueueFull": "tenure.control.gate",
    "JobsClient": "tenure.control.jobs",
    "LocalClient": "tenure.local",
    "connect": "tenure.local",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tenure' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Admitted",
    "BudgetExhausted",
    "ChildFailed",
    "ChildHandle",
    "CircuitOpen",
    "ConfigError",
    "Context",
    "Event",
    "HandlerAborted",
    "IdempotencyConflict",
    "InputTooLarge",
    "InvalidRequest",
    "Job",
    "JobCancelled",
    "JobRequest",
    "JobState",
    "JobsClient",
    "LeaseLost",
    "LocalClient",
    "NotFound",
    "OwnershipLost",
    "PermanentError",
    "QueueFull",
    "QuotaExhausted",
    "QuotaUnavailable",
    "RetryableError",
    "StepUnknown",
    "StoreUnavailable",
    "Tenure",
    "TenureError",
    "UnknownAgent",
    "WorkerState",
    "__version__",
    "connect",
    "tool",
]
