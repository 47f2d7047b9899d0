"""The OpenAPI 3.0 document of HTTP API v1 (served at /openapi.json, fuzzed by schemathesis in the tests)."""

from __future__ import annotations

from typing import Any

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problem(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/problem+json": {"schema": _PROBLEM}}}


def _json(desc: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema}}}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_CONTROL = {"$ref": "#/components/schemas/ControlAnswer"}
_COMMON = {"401": _problem("no valid API key"), "404": _problem("no such job (or another tenant's)")}
# Every body is read by admission's parse_json (docs/http-api.md, "What JSON is accepted").
_BAD_JSON = _problem("JSON not accepted: malformed, NaN/Infinity, a lone surrogate, U+0000, or nested over 64 levels")


def openapi_document(agents: list[str]) -> dict[str, Any]:
    """The document; `agents` (those this gateway admits) are the enum of a job request's `agent`."""
    job = {"$ref": "#/components/schemas/Job"}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Tenure gateway",
            "version": "1",
            "description": "Durable AI-agent jobs over HTTP, SSE and WebSocket (WS /v1/ws, see docs).",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail"],
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                    },
                },
                "JobRequest": {
                    "type": "object",
                    "required": ["agent"],
                    "additionalProperties": False,
                    "description": "Registered agents: " + (", ".join(agents) or "none"),
                    "properties": {
                        "agent": {"type": "string", "enum": agents or [""]},
                        "input": {},
                        "priority": {"type": "integer", "minimum": 0, "maximum": 100, "nullable": True},
                        "requires": {
                            "type": "array",
                            "items": {"type": "string", "pattern": "^[A-Za-z0-9_.:/-]{1,64}$"},
                        },
                        "deadline_s": {
                            "type": "number",
                            "exclusiveMinimum": True,
                            "minimum": 0,
                            "maximum": 604800,
                            "nullable": True,
                        },
                        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100, "nullable": True},
                    },
                },
                "Job": {
                    "type": "object",
                    "required": ["id", "agent", "state", "epoch"],
                    "properties": {
                        "id": {"type": "string"},
                        "tenant": {"type": "string"},
                        "agent": {"type": "string"},
                        "state": {"type": "string"},
                        "epoch": {"type": "integer"},
                    },
                },
                "JobList": {
                    "type": "object",
                    "required": ["jobs", "next_cursor"],
                    "properties": {
                        "jobs": {"type": "array", "items": job},
                        "next_cursor": {"type": "string", "nullable": True},
                    },
                },
                "Event": {
                    "type": "object",
                    "required": ["id", "epoch", "seq", "type"],
                    "properties": {
                        "id": {"type": "string"},
                        "epoch": {"type": "integer"},
                        "seq": {"type": "integer"},
                        "type": {"type": "string"},
                        "payload": {},
                        "ts": {"type": "number"},
                    },
                },
                "ControlAnswer": {
                    "type": "object",
                    "required": ["job_id", "outcome"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "command": {"type": "string"},
                        "outcome": {"type": "string", "enum": ["requested", "accepted", "already_finished"]},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobRequest"}}},
                    },
                    "responses": {
                        "201": _json("created", job),
                        "200": _json("the original job of a replayed key", job),
                        "400": _BAD_JSON,
                        "401": _problem("no valid API key"),
                        "409": _problem("idempotency key reused with another request"),
                        "413": _problem("body too large"),
                        "422": _problem("invalid request or unknown agent"),
                        "429": _problem("queue cap reached (Retry-After)"),
                        "503": _problem("circuit open for this agent (Retry-After)"),
                    },
                },
                "get": {
                    "operationId": "listJobs",
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {
                                "type": "string",
                                "enum": [
                                    "queued",
                                    "scheduled",
                                    "running",
                                    "waiting",
                                    "succeeded",
                                    "failed",
                                    "cancelled",
                                    "lost",
                                    "expired",
                                    "dead",
                                ],
                            },
                        },
                        {"name": "agent", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string", "format": "uuid"}},
                    ],
                    "responses": {
                        "200": _json("jobs, newest first", {"$ref": "#/components/schemas/JobList"}),
                        "400": _problem("bad parameter"),
                        "401": _problem("no valid API key"),
                    },
                },
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json("the job", job), **_COMMON},
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "parameters": [
                        _JOB_ID,
                        {
                            "name": "wait",
                            "in": "query",
                            "schema": {"type": "number", "minimum": 0, "maximum": 30},
                        },
                    ],
                    "responses": {
                        "200": _json("accepted or already finished", _CONTROL),
                        "202": _json("requested: the owner will act on it", _CONTROL),
                        "400": _problem("bad parameter"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/input": {
                "post": {
                    "operationId": "sendInput",
                    "parameters": [_JOB_ID],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["input"],
                                    "additionalProperties": False,
                                    "properties": {"input": {}},
                                }
                            }
                        },
                    },
                    "responses": {
                        "202": _json("persisted and delivered to the owner", _CONTROL),
                        "400": _BAD_JSON,
                        "409": _problem("the job is finished"),
                        "413": _problem("body too large"),
                        "422": _problem("invalid body"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/approve": {
                "post": {
                    "operationId": "approveJob",
                    "parameters": [_JOB_ID],
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "approved": {"type": "boolean"},
                                        "comment": {"type": "string"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "202": _json("persisted and delivered to the owner", _CONTROL),
                        "400": _BAD_JSON,
                        "409": _problem("the job is finished"),
                        "413": _problem("body too large"),
                        "422": _problem("invalid body"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "jobEvents",
                    "description": "SSE (text/event-stream; resume with Last-Event-ID) or, with format=json, a page of "
                    "the history after a cursor. An SSE request for a finished job with no event after its cursor "
                    "(a reconnect at or past the terminal event) is answered 204: stop reconnecting.",
                    "parameters": [
                        _JOB_ID,
                        {
                            "name": "format",
                            "in": "query",
                            "schema": {"type": "string", "enum": ["json"]},
                            "required": True,
                        },
                        {
                            "name": "after",
                            "in": "query",
                            "schema": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            "a page of history",
                            {
                                "type": "object",
                                "properties": {
                                    "events": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Event"},
                                    },
                                    "next": {"type": "string", "nullable": True},
                                },
                            },
                        ),
                        "204": {"description": "SSE only: the job is finished and nothing follows the cursor"},
                        "400": _problem("bad cursor (two integers from 0 to 2^63-1) or parameter"),
                        **_COMMON,
                    },
                }
            },
            "/v1/workers": {
                "get": {
                    "operationId": "listWorkers",
                    "responses": {
                        "200": _json("the registry", {"type": "object"}),
                        "401": _problem("no valid API key"),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "security": [],
                    "responses": {"200": _json("alive", {"type": "object"})},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "security": [],
                    "responses": {
                        "200": _json("the store answers", {"type": "object"}),
                        "503": _problem("the store does not answer"),
                    },
                }
            },
        },
    }
