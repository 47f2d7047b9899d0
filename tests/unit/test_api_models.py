"""The HTTP API's bodies are declared once (control/models.py): the validators, the 422 details and the OpenAPI
document are read from the same models, and clients read answers back into the runtime's own types."""

from __future__ import annotations

from typing import Any

import pytest

from tenure.contracts.errors import InvalidRequest
from tenure.contracts.states import JobState
from tenure.contracts.types import Event, Job
from tenure.control.admission import Admitted
from tenure.control.models import (
    ApprovalBody,
    InputBody,
    JobSpec,
    SubmitFrame,
    event_from_wire,
    job_from_wire,
    validated,
)
from tenure.gateway.openapi import openapi_document

JOB = Job(
    "01a22726-0000-7000-8000-000000000000", "t", "echo", {"a": [1]}, 3, ("gpu",), JobState.QUEUED, None, 0, None,
    0, 3, 9.0, False, None, None, None, 1.5, 1.5, None, None, None, None, 301.5, None, None,
)  # fmt: skip


def keywords(schema: Any) -> set[str]:
    """Every key used anywhere in a JSON Schema as a keyword (the names under `properties` are fields, e.g. the
    job's `strict`, not keywords: their schemas are walked)."""
    if isinstance(schema, dict):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        values = [v for k, v in schema.items() if not (k == "properties" and props)] + list(props.values())
        return set(schema) | {k for v in values for k in keywords(v)}
    if isinstance(schema, list):
        return {k for v in schema for k in keywords(v)}
    return set()


def test_the_document_publishes_the_models_in_json_schema_words_only() -> None:
    doc = openapi_document(["echo", "sleep"])
    schemas = doc["components"]["schemas"]
    assert doc["openapi"].startswith("3.1")
    # Constraints pydantic could not translate would appear under its own names and bind no client.
    assert not keywords(schemas) & {"ge", "le", "gt", "lt", "strict"}
    spec = schemas["JobSpec"]
    assert spec["properties"]["agent"]["enum"] == ["echo", "sleep"] and spec["additionalProperties"] is False
    assert spec["properties"]["priority"]["anyOf"][0] == {"maximum": 100, "minimum": 0, "type": "integer"}
    assert set(spec["properties"]) == set(JobSpec.model_fields)
    assert set(schemas["Job"]["properties"]) == set(JOB.to_dict())  # the dataclass itself is the answer
    refs = {r for path in doc["paths"].values() for op in path.values() for r in _refs(op)}
    assert refs <= {f"#/components/schemas/{name}" for name in schemas}


def _refs(value: Any) -> set[str]:
    if isinstance(value, dict):
        own = {value["$ref"]} if "$ref" in value else set()
        return own | {r for v in value.values() for r in _refs(v)}
    return {r for v in value for r in _refs(v)} if isinstance(value, list) else set()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"agent": "echo", "priority": 1000}, "priority must be an integer from 0 to 100, not 1000"),
        ({"agent": "echo", "priority": "1"}, "priority must be an integer from 0 to 100, not '1'"),
        ({"agent": "echo", "max_attempts": True}, "max_attempts must be an integer from 1 to 100, not True"),
        ({"agent": "echo", "deadline_s": 0}, "deadline_s must be a number of seconds in (0, 604800], not 0"),
        ({"agent": "echo", "requires": "gpu"}, "requires must be a list of capability tags, not 'gpu'"),
        ({"agent": "echo", "requires": ["a b"]}, "'a b' is not a valid capability tag"),
        ({"input": 1}, "agent is required: the name of a registered agent"),
        ({"agent": "echo", "x": 1, "y": 2}, "unknown fields: 'x', 'y' (allowed: agent, budget, concurrency_key, "),
        ([1, 2], "the request body must be a JSON object"),
    ],
)
def test_a_refusal_is_worded_from_the_fields_description(body: Any, detail: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validated(JobSpec, body)
    assert str(info.value).startswith(detail)


def test_json_numbers_are_read_as_json_schema_reads_them() -> None:
    spec = validated(JobSpec, {"agent": "echo", "priority": 7.0, "max_attempts": 2.0, "deadline_s": 60})
    assert (spec.priority, spec.max_attempts) == (7, 2) and type(spec.priority) is int
    assert spec.deadline_s == 60 and type(spec.deadline_s) is int  # kept as sent: the fingerprint is its JSON
    with pytest.raises(InvalidRequest):
        validated(JobSpec, {"agent": "echo", "priority": 7.5})


def test_the_websocket_and_http_bodies_are_the_same_models() -> None:
    assert set(JobSpec.model_fields) < set(SubmitFrame.model_fields)
    assert validated(InputBody, {"input": [1]}).input == [1]
    assert validated(ApprovalBody, {}).model_dump() == {"approved": True, "comment": None}
    for bad in ({"approved": "yes"}, {"comment": 5}, {"approved": True, "extra": 1}):
        with pytest.raises(InvalidRequest):
            validated(ApprovalBody, bad)
    with pytest.raises(InvalidRequest, match="input is required"):
        validated(InputBody, {})
    with pytest.raises(InvalidRequest, match="unknown fields: 'wrong'"):
        validated(InputBody, {"wrong": 1})


def test_answers_read_back_into_the_runtimes_own_types() -> None:
    assert job_from_wire(JOB.to_dict()) == JOB
    event = Event(JOB.id, None, 2, 5, "message.delta", {"text": "hi"}, 3.25)
    assert event_from_wire(event.to_dict()) == event
    admitted = Admitted(JOB, False)
    # What the HTTP client's dicts offered, kept: ["id"], ["_created"], ["state"] as its value.
    assert (admitted["id"], admitted["_created"], admitted["state"], event["id"]) == (JOB.id, False, "queued", "2-5")
    assert admitted.id == admitted.job_id == JOB.id
