"""The edges that keep a worker alive: every driver error becomes `StoreUnavailable`, a background loop that
raises is started again, and error text is always storable."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from tenure.backends.postgres._connections import translate
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.types import clean_text, describe_error, dumps
from tenure.worker.duties import keep_running as _keep_running


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        ConnectionResetError("reset by peer"),
        TimeoutError(),
    ],
)
def test_every_asyncpg_failure_is_translated_to_store_unavailable(exc: BaseException) -> None:
    with pytest.raises(StoreUnavailable) as info, translate("heartbeat"):
        raise exc
    assert info.value.__cause__ is exc


async def test_a_background_loop_that_raises_is_started_again_and_never_ends_its_group(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def flaky_loop() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError(f"failure {runs}")

    with caplog.at_level(logging.ERROR, "tenure.worker"):
        async with asyncio.timeout(5), asyncio.TaskGroup() as tg:
            tg.create_task(_keep_running("heartbeat", flaky_loop))
    assert runs == 3
    assert sum("the heartbeat loop failed" in r.getMessage() for r in caplog.records) == 2


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_describing_an_error_never_raises_and_gives_storable_text() -> None:
    assert describe_error(_Unprintable()).startswith("_Unprintable")
    text = describe_error(ValueError("a\x00b\ud800" + "x" * 10_000), limit=100)
    assert "\x00" not in text and "\ud800" not in text and len(text) < 200
    text.encode("utf-8")
    assert clean_text("plain") == "plain"


@pytest.mark.parametrize("value", [{"a": "\ud800"}, ["\udfff"], float("nan"), {"x": float("inf")}])
def test_dumps_refuses_json_no_store_can_hold(value: object) -> None:
    with pytest.raises(ValueError):
        dumps(value)
