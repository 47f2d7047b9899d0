"""The bodies of HTTP API v1, declared once (pydantic v2): what validates a request, what a `422` says, and what
`/openapi.json` publishes are all read from these models.

    JobSpec          POST /v1/jobs (and the job fields of a WebSocket `submit` frame, and of `JobRequest`)
    InputBody        POST /v1/jobs/{id}/input, and the WebSocket `input` frame
    ApprovalBody     POST /v1/jobs/{id}/approve, and the WebSocket `approve` frame
    JobOut ... Problem   the answers (JobOut is the `Job` dataclass of contracts/types.py itself)

A field's `description` is the phrase a refusal uses: `priority` described as "an integer from 0 to 100" is
refused with "priority must be an integer from 0 to 100, not 1000", and the OpenAPI document says the same words.
Models validate values already decoded by `parse_json` (which guards depth, NaN, lone surrogates and NUL first),
in strict mode: `"5"` is not an integer and `true` is not a number, as JSON means them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from tenure.contracts.audit import BUDGET_MAX
from tenure.contracts.errors import InvalidRequest
from tenure.contracts.types import Event, Job

MAX_PRIORITY = 100
MAX_ATTEMPTS = 100
MAX_DEADLINE_S = 7 * 24 * 3600.0
MAX_KEY_LENGTH = 255
TAG_PATTERN = r"^[A-Za-z0-9_.:/-]{1,64}$"

Feature = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$"),
    Field(description="a feature name (letters, digits, _.:-, 1-64 chars)"),
]
Tag = Annotated[
    str,
    StringConstraints(pattern=TAG_PATTERN),
    Field(description="a valid capability tag (letters, digits, _.:/-, 1-64 chars)"),
]
IdempotencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_KEY_LENGTH),
    Field(description=f"an idempotency key of 1 to {MAX_KEY_LENGTH} characters"),
]
Tenant = Annotated[str, StringConstraints(min_length=1), Field(description="a non-empty string")]
ConcurrencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_KEY_LENGTH),
    Field(description=f"a concurrency key of 1 to {MAX_KEY_LENGTH} characters"),
]

_STRICT = ConfigDict(extra="forbid", strict=True)


def _integral(value: Any) -> Any:
    # JSON Schema counts 93.0 as an integer (a number with no fractional part), and the OpenAPI document is read
    # by that rule (schemathesis sends such numbers): the model takes it as the integer it is. "93" and true stay
    # refused (strict mode).
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# The range first, then the validator around it: so the JSON Schema keeps `minimum` and `maximum`.
Priority = Annotated[int, Field(ge=0, le=MAX_PRIORITY), BeforeValidator(_integral)]
Attempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS), BeforeValidator(_integral)]


_MAX = BUDGET_MAX["cost"]  # cost and wall_s share it
_Positive = Annotated[int, Field(gt=0, le=_MAX)] | Annotated[float, Field(gt=0, le=float(_MAX))]


class Budget(BaseModel):
    """Limits of one job across all its attempts (docs/budgets.md); reaching one ends the job `failed` with code
    `budget_exhausted`. Every limit is optional; a budget without any is no budget."""

    model_config = _STRICT

    tool_calls: Annotated[
        Annotated[int, Field(ge=1, le=BUDGET_MAX["tool_calls"]), BeforeValidator(_integral)] | None,
        Field(description="the most tool calls (ctx.tool_call) the job may make"),
    ] = None
    tokens: Annotated[
        Annotated[int, Field(ge=1, le=BUDGET_MAX["tokens"]), BeforeValidator(_integral)] | None,
        Field(description="the most input + output tokens (ctx.usage) the job may use"),
    ] = None
    cost: Annotated[_Positive | None, Field(description="the most cost_usd (ctx.usage) the job may spend")] = None
    wall_s: Annotated[_Positive | None, Field(description="the most seconds the job's executions may run, in all")] = None


class JobSpec(BaseModel):
    """What a client asks for when it submits a job (the `JobSpec` schema of the OpenAPI document). Only `agent`
    is required."""

    model_config = _STRICT

    agent: Annotated[str, Field(min_length=1, description="the name of a registered agent")]
    input: Annotated[Any, Field(description="any JSON value: the job's input")] = None
    priority: Annotated[
        Priority | None,
        Field(description=f"an integer from 0 to {MAX_PRIORITY}"),
    ] = None
    requires: Annotated[list[Tag] | None, Field(description="a list of capability tags")] = None
    # int | float, not float: an integer stays one, so the request's fingerprint (its JSON) is what was sent.
    deadline_s: Annotated[
        Annotated[int, Field(gt=0, le=MAX_DEADLINE_S)] | Annotated[float, Field(gt=0, le=MAX_DEADLINE_S)] | None,
        Field(description=f"a number of seconds in (0, {MAX_DEADLINE_S:g}]"),
    ] = None
    max_attempts: Annotated[
        Attempts | None,
        Field(description=f"an integer from 1 to {MAX_ATTEMPTS}"),
    ] = None
    # Scheduling (docs/scheduling.md).
    concurrency_key: ConcurrencyKey | None = None
    multitask: Annotated[
        Literal["enqueue", "reject", "interrupt", "drop_queued"] | None,
        Field(description="one of enqueue, reject, interrupt, drop_queued"),
    ] = None
    mode: Annotated[str | None, Field(min_length=1, max_length=64, description="a mode the agent declares")] = None
    budget: Annotated[Budget | None, Field(description="limits: tool_calls, tokens, cost, wall_s (docs/budgets.md)")] = None
    # Routing (docs/routing.md).
    prefers: Annotated[
        list[Feature] | None,
        Field(description="features a worker offering them is preferred for (a bonus to its routing score)"),
    ] = None
    strict: Annotated[
        bool | None, Field(description="a boolean: the preferred features are required (enforced by the claim)")
    ] = None


class SubmitFrame(JobSpec):
    """The WebSocket `submit` frame: a job request, its idempotency key, and whether to subscribe at once."""

    model_config = _STRICT

    op: Literal["submit"]
    ref: Annotated[Any, Field(description="any JSON value, echoed in the answer")] = None
    idempotency_key: IdempotencyKey | None = None
    subscribe: Annotated[bool, Field(description="a boolean")] = False


class InputBody(BaseModel):
    """The body of `POST /v1/jobs/{id}/input`: the value the handler's `ctx.next_input()` returns."""

    model_config = _STRICT

    input: Annotated[Any, Field(description="any JSON value")]


class RequeueBody(BaseModel):
    """The body of `POST /v1/jobs/{id}/requeue` (optional): `input` replaces the job's input (`null` included);
    without it the job runs again with its input as it was."""

    model_config = _STRICT

    input: Annotated[Any, Field(description="any JSON value: the job's new input")] = None


class ApprovalBody(BaseModel):
    """The body of `POST /v1/jobs/{id}/approve` (both optional): what `ctx.approval(prompt)` returns."""

    model_config = _STRICT

    approved: Annotated[bool, Field(description="a boolean")] = True
    comment: Annotated[str | None, Field(description="a string")] = None


# -- answers -----------------------------------------------------------------------------------------------------------
JobOut: TypeAdapter[Job] = TypeAdapter(Job)
"""A job as the API answers it: the `Job` dataclass, serialized by `Job.to_dict()` and read back by clients."""


class EventOut(BaseModel):
    """One event of a job's history (an SSE `data:` line, a WebSocket `event`, an item of a page)."""

    id: Annotated[str, Field(description="the event's cursor EPOCH-SEQ")]
    job_id: str
    execution_id: str | None
    epoch: int
    seq: int
    type: str
    payload: Any
    ts: float

    def to_event(self) -> Event:
        """The `Event` this describes."""
        return Event(self.job_id, self.execution_id, self.epoch, self.seq, self.type, self.payload, self.ts)


class ArtifactStub(BaseModel):
    """What a job's `result` (or an evidence record's `content`) holds when the value is in the artifact store
    (docs/artifacts.md): fetch it with `GET /v1/jobs/{id}/result` or `GET /v1/artifacts/{ref}`."""

    artifact: Annotated[str, Field(alias="$artifact", description="the reference: <job id>.<sha256>")]
    size: Annotated[int, Field(ge=0, description="the artifact's size in bytes (its JSON text, UTF-8)")]
    sha256: Annotated[str, Field(pattern="^[0-9a-f]{64}$", description="the SHA-256 of its bytes (hex)")]


class JobList(BaseModel):
    """A page of jobs, newest first; `next_cursor` is the `cursor` of the next page (null on the last)."""

    jobs: list[Job]
    next_cursor: str | None


class EventPage(BaseModel):
    """A page of a job's history after a cursor, with the job's state when it was read."""

    job_id: str
    events: list[EventOut]
    next: Annotated[str | None, Field(description="the cursor of the last event (or the one asked after)")]
    state: str


class ControlAnswer(BaseModel):
    """The answer to a control command once it is persisted."""

    job_id: str
    command: Literal["cancel", "input", "approve"]
    outcome: Literal["requested", "accepted", "already_finished"]


class WorkerOut(BaseModel):
    """One worker of the registry; `jobs_held` is a count for a tenant, the job ids for the admin."""

    id: str
    host: str
    pid: int
    concurrency: int
    agents: list[str]
    capabilities: list[str]
    state: str
    in_flight: int
    started_at: float | None
    last_heartbeat: float | None
    jobs_held: int | list[str]
    # The profile (docs/routing.md): features, the worker's own record, whether a drain was asked for.
    features: list[str]
    success_rate: float | None
    latency_ms: float | None
    consecutive_timeouts: int
    drain_requested: bool


class WorkerList(BaseModel):
    """The registry."""

    workers: list[WorkerOut]


class Health(BaseModel):
    """`/healthz` and `/readyz` (the latter with the event hub's subscriber count)."""

    status: Literal["ok", "ready"]
    subscribers: int | None = None


class Problem(BaseModel):
    """An error (RFC 9457). Some carry more: `existing_job_id` (409), `outcome` (404 and 409 of a command)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str


# -- validation --------------------------------------------------------------------------------------------------------
M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], value: Any, what: str = "the request body") -> M:
    """`value` validated by `model`, or `InvalidRequest` whose message is derived from the fields' descriptions."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise InvalidRequest(refusal(model, exc.errors(include_url=False))) from None


def check(adapter: TypeAdapter[Any], value: Any, name: str) -> None:
    """Validate one value (a field outside a body, such as a tenant or an Idempotency-Key) or raise
    `InvalidRequest` saying `name must be <its description>`."""
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        description = adapter.json_schema().get("description", "valid")
        raise InvalidRequest(f"{name} must be {description}, not {shown(value)}") from None


TENANT: TypeAdapter[str] = TypeAdapter(Tenant)
"""The validator of a tenant name (outside any body: it comes from the API key, or a Python caller)."""
KEY: TypeAdapter[str] = TypeAdapter(IdempotencyKey)
"""The validator of an idempotency key (the `Idempotency-Key` header, or a frame's `idempotency_key`)."""
CONCURRENCY_KEY: TypeAdapter[str] = TypeAdapter(ConcurrencyKey)
"""The validator of a concurrency key (a Python caller's `concurrency_key=`)."""


def refusal(model: type[BaseModel], errors: Sequence[ErrorDetails]) -> str:
    """The detail of a `422`: unknown fields first (named, at most five), else the first field's error."""
    unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden" and e["loc"]]
    if unknown:
        names = ", ".join(shown(u, 40) for u in sorted(unknown)[:5])  # a body may hold a megabyte of names
        if len(unknown) > 5:
            names += f" and {len(unknown) - 5} more"
        return f"unknown fields: {names} (allowed: {', '.join(sorted(model.model_fields))})"
    first = errors[0]
    loc = first["loc"]
    field = model.model_fields.get(str(loc[0])) if loc else None
    name = str(loc[0]) if loc else "the body"
    description = (field.description if field is not None else None) or "valid"
    if first["type"] == "missing":
        return f"{name} is required: {description}"
    if len(loc) > 1 and name == "requires":  # an item of the list: a tag
        tag = TypeAdapter(Tag).json_schema()["description"]
        return f"{shown(first['input'])} is not {tag}"
    return f"{name} must be {description}, not {shown(first['input'])}"


def shown(value: Any, limit: int = 60) -> str:
    """`repr` of a client's value for an error message, cut to `limit` characters: a problem body quotes what
    was wrong, never the whole megabyte of it."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit has no repr
        text = "<an integer too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def job_from_wire(data: Any) -> Job:
    """A `Job` from its JSON form (an answer of the gateway)."""
    return JobOut.validate_python(data)


def event_from_wire(data: Any) -> Event:
    """An `Event` from its JSON form (an SSE `data:` line or an item of a page)."""
    return EventOut.model_validate(data).to_event()
