"""The OpenAPI 3.1 document of HTTP API v1 (served at /openapi.json, fuzzed by schemathesis in the tests).

Every body — request and answer — is the JSON Schema of a model of `control.models`, the same models that
validate the requests: the document cannot say something the gateway does not do. What is written here is only
what no body model holds: the paths, their parameters and which status each may answer.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from tenure.contracts.states import JobState
from tenure.control.jobs import MAX_DRAIN_S, MAX_WAIT_S
from tenure.control.models import (
    KEY,
    ApprovalBody,
    ArtifactStub,
    ControlAnswer,
    EventPage,
    Health,
    InputBody,
    JobList,
    JobSpec,
    Problem,
    RequeueBody,
    WorkerList,
)

MAX_LIST = 500
"""The largest page of `GET /v1/jobs`."""
MAX_EVENTS_PAGE = 10000
"""The largest page of `GET /v1/jobs/{id}/events?format=json`."""

_REF = "#/components/schemas/{model}"
_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (JobSpec, "validation"),
    (InputBody, "validation"),
    (ApprovalBody, "validation"),
    (RequeueBody, "validation"),
    (JobList, "serialization"),
    (EventPage, "serialization"),
    (ControlAnswer, "serialization"),
    (WorkerList, "serialization"),
    (Health, "serialization"),
    (ArtifactStub, "serialization"),
    (Problem, "serialization"),
]


@functools.cache
def _model_schemas() -> dict[str, Any]:
    _, top = models_json_schema(_MODELS, ref_template=_REF)
    schemas: dict[str, Any] = top["$defs"]
    return schemas


def _schemas() -> dict[str, Any]:
    return copy.deepcopy(_model_schemas())  # each document adds its agents: the cached schemas stay as derived


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _problem(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


def _json(desc: str, schema: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": _ref(schema)}}}


def _body(schema: str, *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": _ref(schema)}}}


def _query(name: str, schema: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_CURSOR = {"type": "string", "pattern": "^[0-9]+-[0-9]+$"}
_COMMON = {"401": _problem("no valid API key"), "404": _problem("no such job (or another tenant's)")}
# Every body is read by admission's parse_json (docs/http-api.md, "What JSON is accepted").
_BAD_JSON = _problem("JSON not accepted: malformed, NaN/Infinity, a lone surrogate, U+0000, or nested over 64 levels")


def _stream() -> dict[str, Any]:
    return {
        "description": "the JSON text, streamed (Content-Length; ETag: its SHA-256)",
        "headers": {"ETag": {"schema": {"type": "string"}}, "Content-Length": {"schema": {"type": "integer"}}},
        "content": {"application/json": {"schema": {}}},
    }


_COMMAND = {
    "202": _json("persisted and delivered to the owner", "ControlAnswer"),
    "400": _BAD_JSON,
    "409": _problem("the job is finished"),
    "413": _problem("body too large"),
    "422": _problem("invalid body"),
    **_COMMON,
}


def openapi_document(agents: list[str]) -> dict[str, Any]:
    """The document; `agents` (those this gateway admits) are the enum of a job request's `agent`."""
    schemas = _schemas()
    agent = schemas["JobSpec"]["properties"]["agent"]
    agent["enum"] = agents or [""]
    # Admission also accepts the agents of live workers (docs/routing.md); the enum names the app's own, those a
    # client can count on whichever workers are up.
    schemas["JobSpec"]["description"] += (
        " Registered agents: " + (", ".join(agents) or "none") + " (and those of the live workers, docs/routing.md)"
    )
    idempotency_key = {"name": "Idempotency-Key", "in": "header", "required": False, "schema": KEY.json_schema()}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tenure gateway",
            "version": "1",
            "description": "Durable AI-agent jobs over HTTP, SSE and WebSocket (WS /v1/ws, see docs).",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": schemas},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "parameters": [idempotency_key],
                    "requestBody": _body("JobSpec"),
                    "responses": {
                        "201": _json("created", "Job"),
                        "200": _json("the original job of a replayed key", "Job"),
                        "400": _BAD_JSON,
                        "401": _problem("no valid API key"),
                        "409": _problem(
                            "idempotency key reused with another request, or the concurrency key of a `reject` job "
                            "is busy (`running_job_id`)"
                        ),
                        "413": _problem("body too large"),
                        "422": _problem("invalid request or unknown agent"),
                        "429": _problem("queue cap reached: global, tenant or the agent's max_queued (Retry-After)"),
                        "503": _problem("circuit open for this agent (Retry-After)"),
                    },
                },
                "get": {
                    "operationId": "listJobs",
                    "parameters": [
                        _query("state", {"type": "string", "enum": [s.value for s in JobState]}),
                        _query("agent", {"type": "string"}),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST}),
                        _query("cursor", {"type": "string", "format": "uuid"}),
                    ],
                    "responses": {
                        "200": _json("jobs, newest first", "JobList"),
                        "400": _problem("bad parameter"),
                        "401": _problem("no valid API key"),
                    },
                },
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": _json(
                            "the job, with `waiting_reason` (null unless it has not started) and `route` (null "
                            "unless admission routed it: the preferred worker, `grace_ends_at`, each candidate's "
                            "score by factor, the weights, `claimed_by` and `why`; docs/routing.md)",
                            "Job",
                        ),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "parameters": [_JOB_ID, _query("wait", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S})],
                    "responses": {
                        "200": _json("accepted or already finished", "ControlAnswer"),
                        "202": _json("requested: the owner will act on it", "ControlAnswer"),
                        "400": _problem("bad parameter"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/input": {
                "post": {
                    "operationId": "sendInput",
                    "parameters": [_JOB_ID],
                    "requestBody": _body("InputBody"),
                    "responses": _COMMAND,
                }
            },
            "/v1/jobs/{job_id}/approve": {
                "post": {
                    "operationId": "approveJob",
                    "parameters": [_JOB_ID],
                    "requestBody": _body("ApprovalBody", required=False),
                    "responses": _COMMAND,
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "jobEvents",
                    "description": "SSE (text/event-stream; resume with Last-Event-ID) or, with format=json, a page of "
                    "the history after a cursor. An SSE request for a finished job with no event after its cursor "
                    "(a reconnect at or past the terminal event) is answered 204: stop reconnecting. SSE with "
                    "include=children: a coordinator's stream with its children's events as `child` frames "
                    "(docs/coordinators.md).",
                    "parameters": [
                        _JOB_ID,
                        _query("format", {"type": "string", "enum": ["json"]}, required=True),
                        _query("after", _CURSOR),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_EVENTS_PAGE}),
                    ],
                    "responses": {
                        "200": _json("a page of history", "EventPage"),
                        "204": {"description": "SSE only: the job is finished and nothing follows the cursor"},
                        "400": _problem("bad cursor (two integers from 0 to 2^63-1) or parameter"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/audit": {
                "get": {
                    "operationId": "jobAudit",
                    "description": "The job's executions, tool calls, evidence, usage records (a page of them, in "
                    "(epoch, seq) order), its journal steps and usage totals (docs/audit.md).",
                    "parameters": [
                        _JOB_ID,
                        _query("cursor", {"type": "string", "pattern": "^[0-9]{1,10}[.][0-9]{1,10}$"}),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                    ],
                    "responses": {
                        "200": {"description": "the audit", "content": {"application/json": {"schema": {"type": "object"}}}},
                        "400": _problem("bad cursor or parameter"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/requeue": {
                "post": {
                    "operationId": "requeueJob",
                    "description": "Put a dead, failed, lost, expired or cancelled job back in the queue with fresh "
                    "attempts; a body with `input` replaces its input (the edit is recorded in its audit).",
                    "parameters": [_JOB_ID],
                    "requestBody": _body("RequeueBody", required=False),
                    "responses": {
                        "200": _json("the job, queued again", "Job"),
                        "400": _problem("bad JSON"),
                        "409": _problem("the job is not finished, or it succeeded"),
                        "422": _problem("the body or its input is refused"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/result": {
                "get": {
                    "operationId": "jobResult",
                    "description": "A succeeded job's result as JSON text: inline from the job, or streamed from its "
                    "artifact when `result` is an ArtifactStub (docs/artifacts.md). ETag: the SHA-256 of the body.",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": _stream(),
                        "304": {"description": "If-None-Match named the body's ETag"},
                        "409": _problem("the job has not succeeded: it has no result"),
                        **_COMMON,
                    },
                }
            },
            "/v1/artifacts/{ref}": {
                "get": {
                    "operationId": "getArtifact",
                    "description": "One artifact (a result's or an evidence record's), by the `$artifact` of its "
                    "ArtifactStub, streamed; tenant-checked through its job.",
                    "parameters": [{"name": "ref", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": _stream(),
                        "304": {"description": "If-None-Match named the body's ETag"},
                        "401": _problem("no valid API key"),
                        "404": _problem("no such artifact, or its job is another tenant's"),
                    },
                }
            },
            "/v1/usage": {
                "get": {
                    "operationId": "usageReport",
                    "description": "The caller's usage records (ctx.usage) between two times, summed per tenant, "
                    "agent or model (docs/audit.md).",
                    "parameters": [
                        _query("from", {"type": "number", "minimum": 0, "maximum": 1e11}),
                        _query("to", {"type": "number", "minimum": 0, "maximum": 1e11}),
                        _query("group_by", {"type": "string", "enum": ["tenant", "agent", "model"]}),
                    ],
                    "responses": {
                        "200": {
                            "description": "the report",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "400": _problem("bad parameter"),
                        "401": _problem("no valid API key"),
                        "422": _problem("bad group_by or time"),
                    },
                }
            },
            "/v1/workers": {
                "get": {
                    "operationId": "listWorkers",
                    "responses": {"200": _json("the registry", "WorkerList"), "401": _problem("no valid API key")},
                }
            },
            "/v1/workers/{worker_id}/drain": {
                "post": {
                    "operationId": "drainWorker",
                    "parameters": [{"name": "worker_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"timeout_s": {"type": "number", "minimum": 0, "maximum": MAX_DRAIN_S}},
                                    "additionalProperties": False,
                                }
                            }
                        },
                    },
                    "responses": {
                        "202": _json("asked: the worker as the registry now shows it (draining)", "WorkerOut"),
                        "400": _BAD_JSON,
                        "401": _problem("no valid API key"),
                        "403": _problem("not the admin key"),
                        "404": _problem("no live worker of this id"),
                        "413": _problem("body too large"),
                        "422": _problem("invalid body"),
                        "503": _problem("the store does not answer"),
                    },
                }
            },
            "/healthz": {"get": {"operationId": "healthz", "security": [], "responses": {"200": _json("alive", "Health")}}},
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "security": [],
                    "responses": {
                        "200": _json("the store answers", "Health"),
                        "503": _problem("the store does not answer"),
                    },
                }
            },
        },
    }
