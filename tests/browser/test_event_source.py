"""A browser's `EventSource` against a real `tenure up`, in headless Chromium (Debian's /usr/bin/chromium, driven
by Playwright; scripts/ensure-browser.sh installs it, `make test` runs that). EventSource reconnects after every
closed stream: the gateway must answer that reconnect 204 so the browser stops, instead of holding one
connection of keep-alives per finished job.

The page runs at the gateway's own origin (its /healthz), so EventSource needs no CORS; the gateway runs without
API keys, on loopback, so the page needs no Authorization header (EventSource cannot send one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, Request, async_playwright

from tests.acceptance.up import Up

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WATCH_S = 10.0  # the window: at most two requests in 10 s


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("browser")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, keys=False)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        # Never a skip: a browser tier that silently does not run proves nothing.
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-browser.sh (make test runs it)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


class EventSourcePage:
    """One page at the gateway's origin with one `EventSource` on a job's events, and every request it made."""

    def __init__(self, page: Page, path: str) -> None:
        self.page = page
        self.path = path
        self.requests: list[Request] = []
        page.on("request", lambda r: self.requests.append(r) if r.url.endswith(path) else None)

    async def open(self, base_url: str, event_types: list[str]) -> None:
        await self.page.goto(base_url + "/healthz")
        await self.page.evaluate(
            """([path, types]) => {
                window.got = [];
                window.errors = 0;
                window.es = new EventSource(path);
                for (const t of types) window.es.addEventListener(t, (e) => window.got.push([e.type, e.lastEventId]));
                window.es.onerror = () => { window.errors += 1; };
            }""",
            [self.path, event_types],
        )

    async def state(self) -> dict[str, Any]:
        out: dict[str, Any] = await self.page.evaluate(
            "({readyState: window.es.readyState, got: window.got, errors: window.errors})"
        )
        return out

    async def answers(self) -> list[tuple[int | None, str | None]]:
        """(status, Last-Event-ID sent) of each request, in order."""
        out = []
        for r in self.requests:
            response = await r.response()
            out.append((None if response is None else response.status, (await r.all_headers()).get("last-event-id")))
        return out


async def wait_state(c: httpx.AsyncClient, job_id: str, states: set[str]) -> None:
    async with asyncio.timeout(20):
        while (await c.get(f"/v1/jobs/{job_id}")).json()["state"] not in states:
            await asyncio.sleep(0.05)


async def history(c: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = (await c.get(f"/v1/jobs/{job_id}/events", params={"format": "json"})).json()["events"]
    return events


async def test_event_source_on_a_finished_job_makes_two_requests_and_stops(up: Up, browser: Browser) -> None:
    async with httpx.AsyncClient(base_url=up.url, timeout=30) as c:
        job = (await c.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 0.2, "every": 0.1}})).json()
        await wait_state(c, job["id"], {"succeeded"})
        events = await history(c, job["id"])
        es = EventSourcePage(await browser.new_page(), f"/v1/jobs/{job['id']}/events")
        await es.open(up.url, sorted({e["type"] for e in events}))
        started = time.monotonic()
        await asyncio.sleep(WATCH_S)
        seen = await es.state()
        answers = await es.answers()
        subscribers = (await c.get("/readyz")).json()["subscribers"]
    assert time.monotonic() - started >= WATCH_S
    assert seen["got"] == [[e["type"], e["id"]] for e in events]  # the whole history, once
    # The history (200, closed after the terminal event), then the reconnect at the terminal event: 204.
    assert answers == [(200, None), (204, events[-1]["id"])], answers
    assert seen["readyState"] == 2, seen  # CLOSED: the browser stopped reconnecting
    assert subscribers == 0  # and the gateway holds no stream for it


async def test_event_source_on_a_running_job_streams_it_live_then_stops(up: Up, browser: Browser) -> None:
    async with httpx.AsyncClient(base_url=up.url, timeout=30) as c:
        job = (await c.post("/v1/jobs", json={"agent": "converse"})).json()
        await wait_state(c, job["id"], {"waiting"})
        es = EventSourcePage(await browser.new_page(), f"/v1/jobs/{job['id']}/events")
        types = ["execution.started", "job.waiting", "job.resumed", "message", "job.succeeded"]
        await es.open(up.url, types)
        async with asyncio.timeout(10):
            while len((await es.state())["got"]) < 2:  # execution.started, job.waiting: the live tail is open
                await asyncio.sleep(0.05)
        for said in ("hello", "bye"):
            assert (await c.post(f"/v1/jobs/{job['id']}/input", json={"input": said})).status_code == 202
        await wait_state(c, job["id"], {"succeeded"})
        await asyncio.sleep(WATCH_S)
        seen = await es.state()
        answers = await es.answers()
        events = await history(c, job["id"])
        subscribers = (await c.get("/readyz")).json()["subscribers"]
    assert seen["got"] == [[e["type"], e["id"]] for e in events] and events[-1]["type"] == "job.succeeded"
    assert answers == [(200, None), (204, events[-1]["id"])], answers
    assert seen["readyState"] == 2 and subscribers == 0, seen
