"""The error hierarchy of Tenure. Every error the runtime raises on purpose derives from `TenureError`.

    TenureError
    ├── ConfigError                 a setting is unknown, malformed or out of range (start-up fails)
    ├── InvalidRequest              bad input from a client; nothing was written
    │   ├── UnknownAgent            no agent of that name is registered
    │   ├── InputTooLarge           the input JSON is over the size limit
    │   └── IdempotencyConflict     the key was used before with a different request
    ├── KeyBusy                     a `reject` job's concurrency key is held by another job (HTTP 409)
    ├── AgentQueueFull              the store refused a job: its agent's waiting jobs are at `max_queued`
    ├── NotFound                    no such job (or not visible to this tenant)
    ├── IllegalTransition           a state change the job state machine does not allow
    ├── StoreUnavailable            the database could not be reached or failed (driver errors wrapped)
    │   ├── LeasesUnavailable       the lease backend (Redis, or a store's leases table) could not answer
    │   └── ArtifactsUnavailable    the artifact store (an S3-compatible bucket) could not be reached or refused
    ├── QuotaExhausted              every slot of a named quota is held (wait=False, or the wait timed out)
    ├── QuotaUnavailable            the lease backend is down and the quota key is fail-closed
    ├── MigrationError              the schema is newer than this code, or a migration failed
    ├── AdapterError                a bounded offload adapter (kernel/blocking.py) refused or lost a call
    │   ├── AdapterOverloaded       its wait queue is full, or the caller waited past the queue timeout
    │   ├── AdapterClosed           it is shutting down and admits no new call
    │   └── AdapterSlotLost         its operation task was cancelled: the slot is written off (fail closed)
    └── ExecutionError              raised inside a running execution
        ├── OwnershipLost           this execution's epoch/token no longer owns the job; stop at once
        ├── LeaseLost               a quota lease of this execution expired or was taken: stop calling out
        ├── JobCancelled            the job was cancelled; the handler should stop
        ├── PermanentError          a handler failure that must not be retried (job → failed)
        │   ├── StepUnknown         a journaled step began in an earlier attempt and never recorded its end
        │   ├── BudgetExhausted     the job reached one of its budget's limits (tool calls, tokens, cost, wall)
        │   └── ChildFailed         a child a coordinator awaited ended other than `succeeded` (docs/coordinators.md)
        ├── RetryableError          a handler failure worth another attempt (job → scheduled or dead)
        └── HandlerAborted          a handler (or a call it offloaded) raised SystemExit, KeyboardInterrupt or
                                    GeneratorExit: its own failure (retried like any error), never the worker's end

Backends translate driver exceptions at their edge (`raise StoreUnavailable(...) from exc`), so no layer above
`backends/` ever catches an asyncpg or sqlite3 exception.
"""

from __future__ import annotations


class TenureError(Exception):
    """Root of every error Tenure raises on purpose. `code` is a stable machine-readable name."""

    code = "tenure_error"


class ConfigError(TenureError):
    """A setting is unknown, malformed or out of range."""

    code = "config_error"


class InvalidRequest(TenureError):
    """A client sent something the runtime will not accept. Nothing was written."""

    code = "invalid_request"


class UnknownAgent(InvalidRequest):
    """The request names an agent that no registered app defines."""

    code = "unknown_agent"


class InputTooLarge(InvalidRequest):
    """The job input, serialized as JSON, is larger than the configured limit."""

    code = "input_too_large"


class IdempotencyConflict(InvalidRequest):
    """The idempotency key was already used by this tenant for a different request."""

    code = "idempotency_conflict"

    def __init__(self, message: str, existing_job_id: str) -> None:
        super().__init__(message)
        self.existing_job_id = existing_job_id


class KeyBusy(TenureError):
    """The job's concurrency key is at its limit and the job asked to be refused then (`multitask="reject"`).
    Nothing was written. `running_job_id`: a job holding the key's turn."""

    code = "key_busy"

    def __init__(self, message: str, running_job_id: str) -> None:
        super().__init__(message)
        self.running_job_id = running_job_id


class AgentQueueFull(TenureError):
    """The store refused to enqueue a job (the batch is rolled back): its agent already has `waiting` jobs
    waiting to start, its cap (`max_queued`). Admission degrades the job to a fallback or answers 429."""

    code = "agent_queue_full"

    def __init__(self, message: str, job_id: str, agent: str, waiting: int) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.agent = agent
        self.waiting = waiting


class NotFound(TenureError):
    """No such object, or it belongs to another tenant (we never say which)."""

    code = "not_found"


class IllegalTransition(TenureError):
    """A job state change that the state machine does not allow."""

    code = "illegal_transition"


class StoreUnavailable(TenureError):
    """The store could not be reached or failed; the driver's exception is the cause."""

    code = "store_unavailable"


class LeasesUnavailable(StoreUnavailable):
    """The lease backend could not be reached or failed; the driver's exception is the cause.

    A subclass of `StoreUnavailable` so that a caller guarding every shared-state backend catches both; the
    quota layer catches this one alone to apply its fail-closed / fail-open policy.
    """

    code = "leases_unavailable"


class ArtifactsUnavailable(StoreUnavailable):
    """The artifact store could not be reached, or refused the request (access denied, no such bucket); the
    client library's exception is the cause. A subclass of `StoreUnavailable`: the gateway answers 503, a
    worker's execution is retried, the retention logs it and goes on."""

    code = "artifacts_unavailable"


class QuotaExhausted(TenureError):
    """Every slot of a named quota is held: `wait=False` was asked, or the wait for a slot timed out."""

    code = "quota_exhausted"

    def __init__(self, message: str, key: str, limit: int) -> None:
        super().__init__(message)
        self.key = key
        self.limit = limit


class QuotaUnavailable(TenureError):
    """The lease backend is down and the quota key is fail-closed, so no slot can be proven free."""

    code = "quota_unavailable"

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class MigrationError(TenureError):
    """The database schema is ahead of this code, or applying a migration failed."""

    code = "migration_error"


class AdapterError(TenureError):
    """Base of the refusals and failures of a bounded offload adapter (`tenure.kernel.blocking`)."""

    code = "adapter_error"


class AdapterOverloaded(AdapterError):
    """The adapter would not take the call: its wait queue is full, or the caller waited past the timeout.

    `reason` is `"queue_full"` (rejected at once) or `"queue_timeout"` (rejected after waiting), so callers
    and metrics can tell a burst from a sustained overload.
    """

    code = "adapter_overloaded"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AdapterClosed(AdapterError):
    """The adapter is shutting down (or shut down): it admits no new call, and callers still waiting leave."""

    code = "adapter_closed"


class AdapterSlotLost(AdapterError):
    """The operation task of an offloaded call was cancelled, so nobody can prove its thread has ended.

    The adapter fails closed: the slot is never given back (capacity shrinks by one) rather than risk one
    more concurrent call than the bound allows.
    """

    code = "adapter_slot_lost"


class ExecutionError(TenureError):
    """Base of the errors that concern one running execution."""

    code = "execution_error"


class OwnershipLost(ExecutionError):
    """This execution's (epoch, token) no longer owns the job: its writes match no row. Stop now."""

    code = "ownership_lost"


class LeaseLost(ExecutionError):
    """A quota lease held by this execution expired or was released from outside (renew reported it lost).

    The slot may already belong to someone else, so the execution must stop calling the upstream it guards.
    """

    code = "lease_lost"

    def __init__(self, message: str, key: str, holder: str) -> None:
        super().__init__(message)
        self.key = key
        self.holder = holder


class JobCancelled(ExecutionError):
    """The job was cancelled while this execution ran."""

    code = "cancelled"


class PermanentError(ExecutionError):
    """Raise from a handler for a failure that another attempt would not fix (the job becomes `failed`)."""

    code = "permanent_error"


class StepUnknown(PermanentError):
    """`ctx.step(key, ...)` found that an earlier attempt began step `key` and never recorded its end (its owner
    was lost mid-step): whether its effect happened is unknown, so the journal never runs it again by itself.
    The handler decides (look at the effect, then `await ctx.resolve_step(key, result)`); left uncaught, the
    job fails with code `step_unknown` rather than retrying into the same question (docs/journal.md)."""

    code = "step_unknown"

    def __init__(self, key: str, started_at: float) -> None:
        super().__init__(f"step {key!r} began at {started_at:.3f} in an earlier attempt and never recorded its end")
        self.key = key
        self.started_at = started_at


class BudgetExhausted(PermanentError):
    """The job reached a limit of its budget (`budget={...}` on submit; docs/budgets.md): it ends `failed` with
    code `budget_exhausted`, and the message names the limit. `.limit` is its name, `.used` and `.allowed` the
    amounts."""

    code = "budget_exhausted"

    def __init__(self, limit: str, used: float, allowed: float) -> None:
        super().__init__(f"the job's {limit} budget is exhausted: {used:g} used of {allowed:g}")
        self.limit = limit
        self.used = used
        self.allowed = allowed


class ChildFailed(PermanentError):
    """A child job a coordinator awaits (`await handle.result()`, `await ctx.gather(...)`) ended in another state
    than `succeeded`. Permanent: a retried parent gets the same child back (spawning is idempotent per parent and
    key), so another attempt would meet the same failure; catch it to decide. `.job_id`, `.state`,
    `.error_code` and `.error_message` are the child's."""

    code = "child_failed"

    def __init__(self, job_id: str, agent: str, state: str, error_code: str | None, error_message: str | None) -> None:
        why = f"{error_code}: {error_message}" if error_code else (error_message or "no error recorded")
        super().__init__(f"child job {job_id} ({agent}) ended {state} ({why})")
        self.job_id = job_id
        self.agent = agent
        self.state = state
        self.error_code = error_code
        self.error_message = error_message


class RetryableError(ExecutionError):
    """Raise from a handler for a failure worth another attempt. Any other exception is treated the same."""

    code = "retryable_error"


class HandlerAborted(ExecutionError):
    """A handler, or a call it offloaded, raised SystemExit, KeyboardInterrupt or GeneratorExit. It is that
    execution's failure (retried like any other error) and ends nothing else: left as they are, asyncio would
    re-raise the first two out of the event loop and end the worker process."""

    code = "handler_aborted"
