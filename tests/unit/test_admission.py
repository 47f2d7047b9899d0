from __future__ import annotations

from typing import Any

import pytest

from tenure.contracts.errors import InputTooLarge, InvalidRequest, UnknownAgent
from tenure.contracts.types import AgentSpec
from tenure.control.admission import (
    ENVELOPE_DEPTH,
    Admission,
    AdmissionLimits,
    InvalidJSON,
    JobRequest,
    idem_digest,
    nesting_exceeds,
    parse_json,
)

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
        ({"agent": "nope"}, UnknownAgent, "unknown agent 'nope': .*\\(known agents: echo\\).*--allow-unregistered"),
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


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ('"\\ud800"', "bad-json", "lone UTF-16 surrogate \\\\ud800"),
        ('{"\\udfff": 1}', "bad-json", "lone UTF-16 surrogate \\\\udfff"),
        ('"\\ude00\\ud83d"', "bad-json", "lone UTF-16 surrogate \\\\ude00"),
        ('"\udcff"', "bad-json", "is not Unicode text"),  # a raw surrogate, as argv's surrogateescape makes one
        (b'"\xed\xa0\x80"', "bad-json", "is not UTF-8 text"),
        (b'"\xff"', "bad-json", "is not UTF-8 text"),
        ("NaN", "bad-json", "NaN is not a JSON number"),
        ("[-Infinity]", "bad-json", "-Infinity is not a JSON number"),
        ("1e999", "bad-json", "out of range"),
        ("9" * 5000, "bad-json", "more than 4300 digits"),
        ("{not json", "bad-json", "is not valid JSON: Expecting property name"),
        ('"\\u0000"', "nul-character", "U\\+0000"),
        ('"\\\\\\u0000"', "nul-character", "U\\+0000"),  # an escaped backslash, then a NUL
        ("[" * 65 + "]" * 65, "too-deep", "deeper than 64 levels"),
        ('{"a":' * 65 + "1" + "}" * 65, "too-deep", "deeper than 64 levels"),
        ("[" * 50_000 + "]" * 50_000, "too-deep", "deeper than 64 levels"),  # past Python's recursion limit
    ],
)
def test_hostile_json_texts_are_refused_with_a_reason(text: str | bytes, kind: str, message: str) -> None:
    with pytest.raises(InvalidJSON, match=message) as info:
        parse_json(text, "the text")
    assert info.value.kind == kind and isinstance(info.value, InvalidRequest)
    assert str(info.value).startswith("the text ")


def test_json_at_the_limits_is_accepted_as_it_was_sent() -> None:
    assert parse_json("[" * 64 + "]" * 64, "x") == parse_json("[" * 64 + "]" * 64, "x", max_depth=64)
    assert parse_json('{"a": ' + "[" * 64 + "]" * 64 + "}", "x", max_depth=ENVELOPE_DEPTH)["a"] is not None
    assert parse_json('"\\ud83d\\ude00"', "x") == "\U0001f600"  # a pair is one character
    assert parse_json('"\\\\u0000 \\\\ud800"', "x") == "\\u0000 \\ud800"  # escaped backslashes: plain text
    assert parse_json(b'\xef\xbb\xbf{"a": 1e308}', "x") == {"a": 1e308}  # a UTF-8 BOM, as json.loads allows
    assert parse_json("9" * 4300, "x") == int("9" * 4300)
    assert parse_json("[" + ",".join(["[]"] * 1000) + "]", "x") == [[]] * 1000  # wide is not deep
    assert not nesting_exceeds([[[]], [[]]], 3) and nesting_exceeds([[[]], [[[]]]], 3)  # [] is one level


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"input": "\ud800"}, "lone UTF-16 surrogate \\\\ud800"),
        ({"input": {"\udc00": 1}}, "lone UTF-16 surrogate \\\\udc00"),
        ({"input": "a\x00b"}, "U\\+0000"),
        ({"idempotency_key": "\ud800"}, "idempotency key"),
        ({"tenant": "\ud800"}, "tenant"),
        ({"deadline_s": 10**400}, "deadline_s must be a number of seconds"),
        ({"priority": 10**5000}, "an integer too large to print"),
        ({"agent": "x" * 10_000}, "unknown agent 'xxx"),
    ],
)
def test_python_callers_are_held_to_the_same_rules(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as info:
        build(**kw)
    assert len(str(info.value)) < 300  # a message quotes the value, not all of it


def test_python_inputs_nested_past_the_limit_are_refused() -> None:
    value: Any = 1
    for _ in range(64):
        value = (value,)  # tuples: json.dumps takes them, the walk sees the JSON the store would hold
    limits = AdmissionLimits(max_input_bytes=10_000)
    Admission(None, AGENTS, limits).build(JobRequest("echo", value))  # type: ignore[arg-type]
    with pytest.raises(InvalidJSON, match="deeper than 64 levels"):
        Admission(None, AGENTS, limits).build(JobRequest("echo", [value]))  # type: ignore[arg-type]
    very: Any = []
    for _ in range(10_000):
        very = [very]
    with pytest.raises(InvalidJSON, match="deeper than 64 levels"):
        Admission(None, AGENTS, limits).build(JobRequest("echo", very))  # type: ignore[arg-type]
