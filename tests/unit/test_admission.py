from __future__ import annotations

from typing import Any

import pytest

from tenure.contracts.errors import InputTooLarge, InvalidRequest, UnknownAgent
from tenure.contracts.types import AgentSpec
from tenure.control.admission import Admission, AdmissionLimits, JobRequest, idem_digest

AGENTS = {"echo": AgentSpec("echo", max_attempts=4, requires=frozenset({"cpu"}), timeout_s=9.0)}


def build(**kw: Any) -> Any:
    return Admission(None, AGENTS, AdmissionLimits(max_input_bytes=100)).build(  # type: ignore[arg-type]
        JobRequest(**{"agent": "echo", "input": {}, **kw})
    )


def test_a_valid_request_takes_the_agents_defaults() -> None:
    job = build(input={"a": 1}, requires=["gpu"])
    assert (job.agent, job.max_attempts, job.timeout_s, job.priority) == ("echo", 4, 9.0, 0)
    assert job.requires == ("cpu", "gpu") and job.input_json == '{"a":1}' and job.deadline_s == 300.0


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"agent": "nope"}, UnknownAgent, "unknown agent 'nope' \\(registered agents: echo\\)"),
        ({"input": {"x": object()}}, InvalidRequest, "not JSON-serializable"),
        ({"input": float("nan")}, InvalidRequest, "not JSON-serializable"),
        ({"input": "x" * 200}, InputTooLarge, "limit is 100 bytes"),
        ({"priority": -1}, InvalidRequest, "priority"),
        ({"priority": True}, InvalidRequest, "priority"),
        ({"priority": 101}, InvalidRequest, "priority"),
        ({"max_attempts": 0}, InvalidRequest, "max_attempts"),
        ({"deadline_s": 0}, InvalidRequest, "deadline_s"),
        ({"deadline_s": float("inf")}, InvalidRequest, "deadline_s"),
        ({"requires": "gpu"}, InvalidRequest, "list of capability tags"),
        ({"requires": ["a,b"]}, InvalidRequest, "capability tag"),
        ({"idempotency_key": ""}, InvalidRequest, "idempotency key"),
        ({"idempotency_key": "k" * 300}, InvalidRequest, "idempotency key"),
        ({"tenant": ""}, InvalidRequest, "tenant"),
    ],
)
def test_bad_requests_are_refused_with_a_message(kw: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build(**kw)


def test_the_idempotency_digest_includes_the_tenant() -> None:
    assert idem_digest("a", "k") != idem_digest("b", "k")
    assert build(idempotency_key="k", tenant="a").idem_digest == idem_digest("a", "k")


def test_the_fingerprint_changes_with_the_request() -> None:
    assert build(input={"a": 1}).request_fingerprint == build(input={"a": 1}).request_fingerprint
    assert build(input={"a": 1}).request_fingerprint != build(input={"a": 2}).request_fingerprint
    assert build(priority=1).request_fingerprint != build(priority=2).request_fingerprint
