"""The dashboard's pieces without I/O: sessions, the CORS allow-list, the access-token middleware, search ranges,
the epoch history and the throughput chart."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from tenure.contracts.errors import ConfigError
from tenure.contracts.insights import FinishedBucket, id_floor
from tenure.contracts.states import JobState
from tenure.contracts.types import Event, Execution, Job, new_id
from tenure.gateway.auth import Auth
from tenure.gateway.cors import SCOPE_KEY, AccessToken, access_token, parse_origins
from tenure.gateway.ui.labs import CATALOG
from tenure.gateway.ui.sessions import COOKIE, Sessions, parse_secret, parse_session_s
from tenure.gateway.ui.views import _ticket_since, epoch_history, id_range, throughput_chart

SECRET = b"s" * 32
AUTH = Auth.from_settings(
    {"api_keys": "tenant-a:key-a-0123456789,tenant-b:key-b-0123456789", "admin_key": "admin-0123456789"}
)


def request(
    cookie: str | None = None, method: str = "GET", headers: dict[str, str] | None = None, host: str = "gw:8000"
) -> Request:
    raw = [(b"host", host.encode())]
    if cookie is not None:
        raw.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    for k, v in (headers or {}).items():
        raw.append((k.lower().encode(), v.encode()))
    scope = {
        "type": "http",
        "method": method,
        "path": "/v1/jobs",
        "headers": raw,
        "query_string": b"",
        "scheme": "http",
        "server": ("gw", 8000),
    }
    return Request(scope)


def test_a_session_names_its_key_without_holding_it_and_ends_when_the_key_is_gone() -> None:
    s = Sessions(AUTH, SECRET)
    assert s.login("nope-0123456789") is None
    cookie = s.login("key-a-0123456789")
    assert cookie is not None and "key-a" not in cookie
    session = s.read(request(cookie))
    assert session is not None and session.principal.tenant == "tenant-a"
    admin = s.read(request(s.login("admin-0123456789")))
    assert admin is not None and admin.principal.is_admin
    assert s.read(request(cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB"))) is None  # tampered
    assert Sessions(AUTH, b"t" * 32).read(request(cookie)) is None  # another secret
    without_a = Auth.from_settings({"api_keys": "tenant-b:key-b-0123456789"})
    assert Sessions(without_a, SECRET).read(request(cookie)) is None  # the key was removed


def test_a_session_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    import itsdangerous.timed

    s = Sessions(AUTH, SECRET, max_age_s=60)
    cookie = s.login("key-a-0123456789")
    assert s.read(request(cookie)) is not None
    real = itsdangerous.timed.time.time
    monkeypatch.setattr(itsdangerous.timed.time, "time", lambda: real() + 61)
    assert s.read(request(cookie)) is None


def test_a_cookie_authenticates_same_origin_reads_and_changes_only_with_the_csrf_token() -> None:
    s = Sessions(AUTH, SECRET)
    cookie = s.login("key-a-0123456789")
    session = s.read(request(cookie))
    assert session is not None
    assert s.principal(request(cookie)) is not None  # a same-origin GET (EventSource sends no Origin)
    assert s.principal(request(cookie, "POST", {"Origin": "http://gw:8000"}), "POST") is None  # no token
    ok = request(cookie, "POST", {"Origin": "http://gw:8000", "X-Tenure-CSRF": session.csrf})
    assert s.principal(ok, "POST") is not None
    other = request(cookie, "POST", {"Origin": "http://gw:3000", "X-Tenure-CSRF": session.csrf})
    assert s.principal(other, "POST") is None  # same site, another port: refused
    assert s.principal(request(cookie, headers={"Sec-Fetch-Site": "same-site"})) is None


def test_an_open_gateway_has_no_login_but_changes_still_need_its_token() -> None:
    s = Sessions(Auth.open(), SECRET)
    session = s.read(request())
    assert s.open and session is not None and session.principal.tenant == "default"
    assert s.principal(request(method="POST"), "POST") is None
    assert s.principal(request(method="POST", headers={"X-Tenure-CSRF": session.csrf}), "POST") is not None


def test_settings_of_the_dashboard_are_checked() -> None:
    assert len(parse_secret(None)) == 32 and parse_secret("x" * 40) == b"x" * 40
    with pytest.raises(ConfigError):
        parse_secret("short")
    assert parse_session_s(None) == 8 * 3600 and parse_session_s("120") == 120
    for bad in ("10", "abc", str(40 * 86400)):
        with pytest.raises(ConfigError):
            parse_session_s(bad)


def test_cors_origins_are_exact_origins() -> None:
    assert parse_origins(None) == ()
    assert parse_origins(" https://App.example.com , http://localhost:5173,https://app.example.com") == (
        "https://app.example.com",
        "http://localhost:5173",
    )
    for bad in ("*", "https://*.example.com", "app.example.com", "https://a.com/path", "ftp://a.com", "https://"):
        with pytest.raises(ConfigError):
            parse_origins(bad)


async def test_the_access_token_leaves_the_query_string_before_anything_sees_it() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)

    scope = {"type": "http", "query_string": b"after=1-2&access_token=key-a-0123456789&x=%20y"}
    await AccessToken(app)(scope, None, None)
    assert seen["query_string"] == b"after=1-2&x=+y" and seen[SCOPE_KEY] == "key-a-0123456789"
    assert access_token(seen) == "key-a-0123456789" and b"key-a" not in scope["query_string"]
    plain = {"type": "http", "query_string": b"after=1-2"}
    await AccessToken(app)(plain, None, None)
    assert plain["query_string"] == b"after=1-2" and access_token(plain) is None


def test_an_id_prefix_is_a_range_of_ids() -> None:
    job = new_id()
    lo, hi = id_range(job[:8])  # type: ignore[misc]
    assert lo <= job <= hi and lo.endswith("0000") and hi.endswith("ffff")
    assert id_range(job) == (job, job)
    assert id_range("order-42") is None and id_range("") is None and id_range("g" * 4) is None
    assert id_floor(0) == "00000000-0000-0000-0000-000000000000"


def _job(epoch: int, state: JobState, owner: str | None = None) -> Job:
    return Job(
        new_id(),
        "t",
        "echo",
        None,
        0,
        (),
        state,
        owner,
        epoch,
        None,
        1,
        3,
        None,
        False,
        None,
        None,
        None,
        0.0,
        0.0,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )


def test_the_epoch_history_names_claims_that_never_started() -> None:
    job = _job(2, JobState.SUCCEEDED)
    run = Execution(new_id(), job.id, 2, "w2", 1.0, 2.0, "succeeded")
    started = Event(job.id, run.id, 2, 1, "execution.started", {"worker_id": "w2"}, 1.0)
    lines = epoch_history(job, [run], [started])
    assert [(x["epoch"], x["worker"], x["what"]) for x in lines] == [
        (1, None, "claimed, never started (the claim was released)"),
        (2, "w2", "succeeded"),
    ]
    live = epoch_history(_job(1, JobState.QUEUED, "w3"), [], [])
    assert live == [{"epoch": 1, "worker": "w3", "what": "claimed, not started yet", "started": None, "ended": None}]


def test_the_throughput_chart_has_sixty_minutes() -> None:
    now = 1_800_000_000.0
    minute = int(now // 60 * 60)
    chart = throughput_chart([FinishedBucket(minute, "succeeded", 8), FinishedBucket(minute, "dead", 2)], now)
    assert len(chart["bars"]) == 60 and chart["top"] == 10
    last = chart["bars"][-1]
    assert (last["ok"], last["bad"], last["ok_h"], last["bad_h"]) == (8, 2, 80.0, 20.0)
    assert _ticket_since(f"{int(now * 1000):012x}{'0' * 20}/holder") == pytest.approx(now, abs=0.001)


def test_lab_parameters_are_checked_against_the_catalog() -> None:
    lab = CATALOG[2]
    assert lab.check({}) == {"limit": 4.0, "crash_rate": 0.3, "seconds": 20.0}
    for bad in ({"limit": 99}, {"limit": "4"}, {"limit": True}, {"nope": 1}, {"crash_rate": float("nan")}):
        with pytest.raises(ValueError):
            lab.check(bad)
