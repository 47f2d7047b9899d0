"""Fuzz the OpenAPI document of the live gateway with schemathesis (a bounded number of examples per
operation): no request may get a 5xx, a stack trace, or an answer the document does not describe. Then the
hostile family on top: schemathesis' cases with lone surrogates and deep nesting mixed into their bodies, and
raw JSON texts (NaN, Infinity, huge numbers, NUL, 50,000 levels) over HTTP and WebSocket, each checked
against an oracle: a text that breaks a rule of docs/http-api.md ("What JSON is accepted") is a 4xx problem."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core import NotSet
from websockets.sync.client import connect

from tenure.control.json_input import MAX_JSON_DEPTH
from tests.acceptance.up import KEYS, Up

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("fuzz")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, app="tests.acceptance.fuzz_app:app")
    yield server
    assert server.stop() == 0, server.log()


def operations(up: Up) -> list[Any]:
    # Driven by hand rather than through schemathesis' pytest plugin, which does not load under this pytest.
    schema = schemathesis.openapi.from_url(up.url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_answers_as_documented(fuzz_up: Up) -> None:
    ops = operations(fuzz_up)
    assert len(ops) >= 10
    for op in ops:

        @FUZZ
        @given(case=op.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzz_up.url, headers=fuzz_up.headers())
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)
            assert "Traceback" not in response.text
            case.validate_response(response, headers=fuzz_up.headers())

        check()
    assert "Traceback" not in fuzz_up.log()


# -- hostile strings and depths inside schemathesis' own cases --------------------------------------------------------
LONE_SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)


@st.composite
def hostile_case(draw: st.DrawFn, case: schemathesis.Case) -> tuple[schemathesis.Case, bool]:
    """The case with a lone surrogate put into a string or a key of its body, or its input or whole body wrapped
    in arrays nested around the limit; True when the result breaks a rule (then it must be refused)."""
    if not isinstance(case.body, dict):
        return case, False
    body: Any = dict(case.body)
    how = draw(st.sampled_from(["value", "key", "deep-input", "deep-body"]))
    lone = draw(LONE_SURROGATES)
    depth = draw(st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 3))
    if how == "value":
        name = draw(st.sampled_from(sorted(body) or ["input"]))
        body[name] = draw(st.text(max_size=3)) + lone + draw(st.text(max_size=3))
    elif how == "key":
        body[lone] = draw(st.none() | st.integers())
    elif how == "deep-input":
        for _ in range(depth):
            body["input"] = [body.get("input")]
    else:
        for _ in range(depth):
            body = [body]
    case.body = body
    return case, how in ("value", "key") or _depth(body) > MAX_JSON_DEPTH + 1


def _depth(value: Any) -> int:
    """How deep a value nests arrays and objects (`[]` is 1), as the gateway counts."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def test_schemathesis_bodies_with_lone_surrogates_and_deep_nesting_never_get_a_5xx(fuzz_up: Up) -> None:
    document = httpx.get(fuzz_up.url + "/openapi.json").json()
    with_bodies = [op for op in operations(fuzz_up) if op.method.upper() == "POST"]
    assert len(with_bodies) >= 4  # submit, cancel, input, approve
    with httpx.Client(base_url=fuzz_up.url, timeout=30) as c:
        for op in with_bodies:
            _fuzz_hostile_cases(c, fuzz_up, op, document["paths"][op.path][op.method.lower()]["responses"])
    assert "Traceback" not in fuzz_up.log()


def _fuzz_hostile_cases(c: httpx.Client, up: Up, op: Any, documented: dict[str, Any]) -> None:
    @FUZZ
    @given(drawn=op.as_strategy().flatmap(hostile_case))
    def check(drawn: tuple[schemathesis.Case, bool]) -> None:
        case, breaks_a_rule = drawn
        # Sent by hand: schemathesis validates a body as UTF-8 before sending it and cannot hold a lone
        # surrogate. json.dumps writes it as its \\u escape, exactly what a hostile client sends.
        headers = {k: str(v).encode("utf-8") for k, v in case.headers.items()} | up.headers()
        body = None if isinstance(case.body, NotSet) else json.dumps(case.body).encode()
        if body is not None:
            headers["Content-Type"] = "application/json"
        r = c.request(case.method, case.formatted_path, params=case.query, headers=headers, content=body)
        what = (case.method, case.formatted_path, (body or b"")[:200], r.status_code, r.text[:300])
        assert r.status_code < 500 and "Traceback" not in r.text, what
        assert str(r.status_code) in documented, what  # every answer is one the document describes
        if r.status_code >= 400:
            assert {"type", "title", "status", "detail"} <= set(r.json()), what
        if breaks_a_rule and body is not None:
            kind = r.json()["type"].rsplit("/", 1)[1]
            assert r.status_code == 400 and kind in ("bad-json", "too-deep", "nul-character"), what

    check()


# -- raw hostile JSON texts, with an oracle ----------------------------------------------------------------------------
# Each strategy draws (text, breaks_a_rule, depth): the JSON text as sent, whether a rule of the parser forbids it,
# and how deep it nests.
Drawn = tuple[str, bool, int]

FINE_TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=6)  # no surrogates by default, and no NUL
FINE_LEAVES: st.SearchStrategy[Drawn] = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=False, allow_infinity=False), FINE_TEXT
).map(lambda v: (json.dumps(v), False, 0))
BAD_LEAVES: st.SearchStrategy[Drawn] = st.one_of(
    LONE_SURROGATES.map(lambda c: f'"x\\u{ord(c):04x}"'),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-2e400", "9" * 4301, '"\\u0000"', '"a\\u0000"']),
).map(lambda t: (t, True, 0))
KEYS_: st.SearchStrategy[tuple[str, bool]] = st.one_of(
    FINE_TEXT.map(lambda k: (json.dumps(k), False)),
    LONE_SURROGATES.map(lambda c: (f'"\\u{ord(c):04x}"', True)),
    st.just(('"\\u0000"', True)),
)


def _array(items: list[Drawn]) -> Drawn:
    text = "[" + ",".join(t for t, _, _ in items) + "]"
    return text, any(b for _, b, _ in items), 1 + max((d for *_, d in items), default=0)


def _object(pairs: list[tuple[tuple[str, bool], Drawn]]) -> Drawn:
    text = "{" + ",".join(f"{k}:{v[0]}" for (k, _), v in pairs) + "}"
    return text, any(kb or v[1] for (_, kb), v in pairs), 1 + max((v[2] for _, v in pairs), default=0)


def _wrapped(levels_and_value: tuple[int, Drawn]) -> Drawn:
    levels, (text, bad, depth) = levels_and_value
    return "[" * levels + text + "]" * levels, bad, depth + levels


JSON_VALUES: st.SearchStrategy[Drawn] = st.recursive(
    st.one_of(FINE_LEAVES, BAD_LEAVES),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(_array),
        st.lists(st.tuples(KEYS_, inner), max_size=3).map(_object),
        st.tuples(st.sampled_from([8, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 1000, 50_000]), inner).map(
            _wrapped
        ),
    ),
    max_leaves=6,
)


def _expect(status: int, text: str, breaks_a_rule: bool, too_deep: bool, what: Any) -> None:
    """A refused text is a 400 of the parser's kinds (too-deep when depth is all that is wrong)."""
    assert status < 500 and "Traceback" not in text, what
    assert status == 400, what
    kind = json.loads(text)["type"].rsplit("/", 1)[1]
    assert kind in ("bad-json", "too-deep", "nul-character"), what
    if too_deep and not breaks_a_rule:
        assert kind == "too-deep", what


def test_raw_hostile_json_over_http_is_refused_exactly_when_it_breaks_a_rule(fuzz_up: Up) -> None:
    with httpx.Client(base_url=fuzz_up.url, headers=fuzz_up.headers(), timeout=30) as c:
        done = c.post("/v1/jobs", json={"agent": "echo", "input": 1}).json()["id"]
        for _ in range(200):
            if c.get(f"/v1/jobs/{done}").json()["state"] == "succeeded":
                break
            time.sleep(0.05)
        # (path, how a drawn value becomes the body, the status of a body that breaks no rule: None for any 4xx)
        doors: list[tuple[str, Callable[[str], str], int | None]] = [
            ("/v1/jobs", lambda v: '{"agent": "echo", "input": ' + v + "}", 201),
            ("/v1/jobs", lambda v: '{"agent": ' + v + "}", None),
            ("/v1/jobs", lambda v: v, None),
            (f"/v1/jobs/{done}/input", lambda v: '{"input": ' + v + "}", 409),  # finished: parsed, then refused
            (f"/v1/jobs/{done}/approve", lambda v: '{"approved": true, "comment": ' + v + "}", None),
        ]
        for path, body_of, fine_status in doors:
            _fuzz_door(c, path, body_of, fine_status)
    assert "Traceback" not in fuzz_up.log()


def _fuzz_door(c: httpx.Client, path: str, body_of: Callable[[str], str], fine_status: int | None) -> None:
    @FUZZ
    @given(drawn=JSON_VALUES)
    def check(drawn: Drawn) -> None:
        value, breaks_a_rule, depth = drawn
        body = body_of(value)
        too_deep = depth + (0 if body is value else 1) > MAX_JSON_DEPTH + 1
        r = c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
        what = (path, body[:200], r.status_code, r.text[:300])
        assert r.status_code < 500 and "Traceback" not in r.text, what
        if breaks_a_rule or too_deep:
            _expect(r.status_code, r.text, breaks_a_rule, too_deep, what)
        elif fine_status is not None:
            assert r.status_code == fine_status, what

    check()


def test_raw_hostile_json_over_websocket_is_refused_exactly_when_it_breaks_a_rule(fuzz_up: Up) -> None:
    url = fuzz_up.url.replace("http", "ws") + "/v1/ws"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}, max_size=None) as ws:

        @FUZZ
        @given(drawn=JSON_VALUES, ref=st.one_of(st.integers(), LONE_SURROGATES.map(lambda c: f"\\u{ord(c):04x}")))
        def check(drawn: Drawn, ref: int | str) -> None:
            value, breaks_a_rule, depth = drawn
            ref_text = json.dumps(ref) if isinstance(ref, int) else f'"{ref}"'  # a str ref is a lone surrogate
            ws.send('{"op": "submit", "ref": ' + ref_text + ', "agent": "echo", "input": ' + value + "}")
            reply = json.loads(ws.recv(timeout=30))
            bad, too_deep = breaks_a_rule or isinstance(ref, str), depth + 1 > MAX_JSON_DEPTH + 1
            what = (value[:200], ref_text, reply)
            if bad or too_deep:
                assert reply["op"] == "error", what
                _expect(reply["status"], json.dumps(reply), bad, too_deep, what)
            else:
                assert reply["op"] == "submitted", what
            ws.send('{"op": "ping", "ref": "alive"}')  # the socket keeps serving whatever it was sent
            assert json.loads(ws.recv(timeout=30)) == {"op": "pong", "ref": "alive"}

        check()
    assert "Traceback" not in fuzz_up.log()
