"""The job page's route (docs/routing.md): why the job went where it went and every candidate's score by factor,
as `GET /v1/jobs/{id}` carries it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from playwright.async_api import Browser, expect

from tests.acceptance.test_cli import tenure
from tests.acceptance.up import ADMIN_KEY, KEYS, Up
from tests.browser.test_dashboard import api, browser, sign_in, wait_state

__all__ = ["browser"]  # the fixture, imported for these tests


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("route")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=2, inline=True)
    yield server
    assert server.stop() == 0, server.log()


async def test_the_job_page_shows_its_route_and_why(up: Up, browser: Browser) -> None:
    job = await api(up, "POST", "/v1/jobs", json={"agent": "echo", "input": {"x": 1}})
    done = await wait_state(up, job["id"], {"succeeded"})
    route = done["route"]
    assert route["reason"] == "local", route  # the gateway's inline worker had room: the local fast path
    s = await sign_in(browser, up, KEYS["tenant-a"])
    await s.goto(f"/ui/jobs/{job['id']}")
    await expect(s.page.get_by_test_id("route-why")).to_have_text(route["why"])
    await expect(s.page.locator("#route")).to_contain_text("reason local")


async def test_a_scored_route_lists_every_candidate_by_factor(up: Up, browser: Browser) -> None:
    # Submitted from outside the gateway (`tenure submit`, its own admission): no inline worker of its own, so
    # the three live workers are scored; alike, none is preferred (near_tie), and each is listed.
    out = await asyncio.to_thread(tenure, up.database_url, "submit", "echo", "--input", '{"y": 2}', "--json")
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["id"]
    done = await wait_state(up, job_id, {"succeeded"}, tenant=None)  # type: ignore[arg-type]
    route = done["route"]
    assert route["candidates_total"] == 3 and route["reason"] in {"near_tie", "preferred"}, route
    s = await sign_in(browser, up, ADMIN_KEY)
    await s.goto(f"/ui/jobs/{job_id}")
    await expect(s.page.get_by_test_id("route-why")).to_have_text(route["why"])
    await expect(s.page.get_by_test_id("route-candidates").locator("tbody tr")).to_have_count(3)
