"""The edges that keep a worker alive: every driver error becomes `StoreUnavailable`, a background loop that
raises is started again, and error text is always storable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg
import pytest

from tenure.backends.postgres._connections import translate
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.text import clean_text, describe_error, dumps
from tenure.contracts.types import Claim, Fence, HeartbeatReply
from tenure.worker.config import WorkerConfig
from tenure.worker.duties import keep_running as _keep_running
from tenure.worker.health import Health
from tenure.worker.heartbeat import Heartbeat
from tenure.worker.held import Held
from tenure.worker.observe import WorkerObserver
from tenure.worker.slots import Slots


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


class _SilentStore:
    """A store behind a pulled cable: the heartbeat's round trip neither answers nor fails (TCP retransmits for
    minutes; asyncpg would even wait for its cancel request over the same dead network)."""

    def __init__(self) -> None:
        self.sent = 0
        self.answer = asyncio.Event()

    async def heartbeat(self, *args: object) -> HeartbeatReply:
        self.sent += 1
        await self.answer.wait()
        raise StoreUnavailable("the reply never came")


async def test_a_heartbeat_that_never_answers_still_fences_the_worker_after_one_claim_ttl() -> None:
    """Self-fencing must not wait for the round trip to fail: a silent network makes no error."""
    config = WorkerConfig(heartbeat_s=0.05, claim_ttl_s=0.3)
    obs = WorkerObserver("w-silent", heartbeat_s=0.05, lag_interval_s=0.05, stall_threshold_s=1, degraded_lag_s=1,
                         degraded_for_s=2)  # fmt: skip
    slots = Slots(1)
    held = Held(slots)
    slots.take()
    held.claimed["job-1"] = Claim(Fence("job-1", 1, 7), "echo", "{}", 0, 3, None, False, "default")
    store = _SilentStore()
    beat = Heartbeat(store, None, "w-silent", config, held, Health(obs), obs, None)  # type: ignore[arg-type]
    began = time.monotonic()
    task = asyncio.create_task(beat.run())
    try:
        while held.claimed and time.monotonic() - began < 3:
            await asyncio.sleep(0.01)
        fenced_after = time.monotonic() - began
    finally:
        task.cancel()
        store.answer.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        obs.close()
    assert store.sent == 1  # one round trip went out and hangs
    assert not held.claimed and slots.busy == 0, "the claim was kept although no heartbeat got through for a TTL"
    assert config.claim_ttl_s <= fenced_after <= config.claim_ttl_s + 2 * config.heartbeat_s + 0.2
