"""The workers page's Drain button: an admin drains a worker from the dashboard, through the same request as
`POST /v1/workers/{id}/drain` and `tenure drain`; a tenant sees no button and is refused the route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from playwright.async_api import Browser, expect

from tests.acceptance.up import ADMIN_KEY, KEYS, Up
from tests.browser.test_dashboard import api, browser, sign_in

__all__ = ["browser"]  # the fixture, imported for these tests


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("drain")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=2)
    yield server
    assert server.stop() == 0, server.log()


async def test_an_admin_drains_a_worker_from_the_workers_page_and_a_tenant_cannot(up: Up, browser: Browser) -> None:
    workers = (await api(up, "GET", "/v1/workers", None))["workers"]
    assert len(workers) == 2
    target = workers[0]["id"]

    tenant = await sign_in(browser, up, KEYS["tenant-a"])
    await tenant.goto("/ui/workers")
    await expect(tenant.page.locator("#live tbody tr")).to_have_count(2)
    assert await tenant.page.locator('[data-action="drain"]').count() == 0
    # The route itself refuses a tenant's session (with its CSRF token, from the page).
    status = await tenant.page.evaluate(
        "async (id) => (await call('POST', `/ui/api/workers/${encodeURIComponent(id)}/drain`)).status", target
    )
    assert status == 403

    admin = await sign_in(browser, up, ADMIN_KEY)
    admin.page.on("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await admin.goto("/ui/workers")
    button = admin.page.locator(f'[data-action="drain"][data-worker="{target}"]')
    await expect(button).to_have_count(1)
    await button.click()
    await expect(admin.page.get_by_test_id("drain-outcome")).to_have_text(f"✓ {target}: draining")
    # The worker drains through the store: draining, then it exits (nothing held) and `tenure up` keeps it down
    # (GET /v1/workers lists the live ones only).
    async with asyncio.timeout(30):
        while True:
            states = {w["id"]: w["state"] for w in (await api(up, "GET", "/v1/workers", None))["workers"]}
            if target not in states:
                break
            await asyncio.sleep(0.1)
    other = next(w for w in workers if w["id"] != target)["id"]
    assert states == {other: "active"}
    await asyncio.sleep(1.5)  # a restart by the supervisor would have registered by now
    assert {w["id"] for w in (await api(up, "GET", "/v1/workers", None))["workers"]} == {other}
    # The page shows no button for a worker that is gone or draining.
    await admin.goto("/ui/workers?all=1")
    await expect(admin.page.locator(f'[data-action="drain"][data-worker="{target}"]')).to_have_count(0)
    await expect(admin.page.locator(f'[data-action="drain"][data-worker="{other}"]')).to_have_count(1)
    # A worker that is not there answers 404 from the page's route, as the API does.
    status = await admin.page.evaluate("async () => (await call('POST', '/ui/api/workers/nope/drain')).status")
    assert status == 404
    assert not (tenant.failures or admin.failures)
