"""Browsers as clients of another origin, in headless Chromium: a page served by a second tiny server calls a real
`tenure up` whose `TENURE_CORS_ORIGINS` lists one origin of that server (`http://127.0.0.1:PORT`) and not the
other (`http://localhost:PORT`, a different origin of the same server). The listed origin submits with its key
and streams the job's events with `EventSource(...?access_token=KEY)`; the other gets nothing."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, async_playwright

from tests.acceptance.up import KEYS, Up, free_port
from tests.browser.test_event_source import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

PAGE = b"<!doctype html><title>another app</title><p>an app on another origin</p>"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, other_site: int) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("cors")
    env = {"TENURE_CORS_ORIGINS": f"http://127.0.0.1:{other_site}"}
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, env=env)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-browser.sh (make test runs it)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


CALL = """async ([gateway, key]) => {
  const out = {};
  try {
    const r = await fetch(gateway + "/v1/jobs", {method: "POST", headers: {"Authorization": "Bearer " + key,
      "Content-Type": "application/json"}, body: JSON.stringify({agent: "sleep", input: {seconds: 0.3, every: 0.1}})});
    out.status = r.status; out.job = (await r.json()).id; out.location = r.headers.get("Location");
  } catch (e) { out.fetch_error = String(e); }
  const id = out.job || "00000000-0000-7000-8000-000000000000";
  out.events = await new Promise((done) => {
    const got = [];
    const es = new EventSource(gateway + "/v1/jobs/" + id + "/events?access_token=" + encodeURIComponent(key));
    for (const t of ["execution.started", "progress", "job.succeeded"]) es.addEventListener(t, (e) => {
      got.push(t); if (t === "job.succeeded") { es.close(); done(got); } });
    es.onerror = () => { if (es.readyState === 2) done(got.length ? got : ["error"]); };
    setTimeout(() => { es.close(); done(got.length ? got : ["timeout"]); }, 8000);
  });
  return out;
}"""


async def test_a_listed_origin_submits_and_streams_and_another_origin_gets_nothing(
    up: Up, browser: Browser, other_site: int
) -> None:
    allowed = await browser.new_page()
    await allowed.goto(f"http://127.0.0.1:{other_site}/")
    got = await allowed.evaluate(CALL, [up.url, KEYS["tenant-a"]])
    assert got["status"] == 201 and got["job"], got
    assert got["location"] == f"/v1/jobs/{got['job']}"  # an exposed header
    assert got["events"][0] == "execution.started" and got["events"][-1] == "job.succeeded", got
    refused = await browser.new_page()
    await refused.goto(f"http://localhost:{other_site}/")
    denied = await refused.evaluate(CALL, [up.url, KEYS["tenant-a"]])
    assert "fetch_error" in denied and "status" not in denied, denied
    assert denied["events"] == ["error"], denied
    # The refused page's preflight never reached admission: tenant-a has exactly the one job the listed origin made.
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a")) as c:
        jobs = (await c.get("/v1/jobs")).json()["jobs"]
    assert [j["id"] for j in jobs] == [got["job"]]
    assert KEYS["tenant-a"] not in up.log()  # the access token never reaches a log line


async def test_preflights_are_answered_for_listed_origins_only(up: Up, other_site: int) -> None:
    listed, other = f"http://127.0.0.1:{other_site}", f"http://localhost:{other_site}"
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    async with httpx.AsyncClient(base_url=up.url) as c:
        ok = await c.options("/v1/jobs", headers={"Origin": listed, **preflight})
        no = await c.options("/v1/jobs", headers={"Origin": other, **preflight})
        plain = await c.options("/v1/jobs")
        simple = await c.get("/healthz", headers={"Origin": other})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == listed
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    assert no.status_code == 400 and "access-control-allow-origin" not in no.headers
    assert plain.status_code == 405  # not a preflight: the API's own answer
    assert "access-control-allow-origin" not in simple.headers
