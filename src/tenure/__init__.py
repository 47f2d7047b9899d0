"""Tenure: a runtime for AI-agent jobs.

from tenure import Tenure, Context

app = Tenure()

@app.agent("echo")
async def echo(ctx: Context, input: dict) -> dict:
    await ctx.emit("message.delta", {"text": "hi"})
    return input
"""

from tenure.app import LocalClient, connect
from tenure.contracts.errors import (
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
    StoreUnavailable,
    TenureError,
    UnknownAgent,
)
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import Event, Job
from tenure.control.admission import Admitted, JobRequest
from tenure.control.gate import CircuitOpen, QueueFull
from tenure.control.jobs import JobsClient
from tenure.kernel.context import Context
from tenure.kernel.registry import Tenure

__version__ = "0.1.0"

__all__ = [
    "Admitted",
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
    "StoreUnavailable",
    "Tenure",
    "TenureError",
    "UnknownAgent",
    "WorkerState",
    "__version__",
    "connect",
]
