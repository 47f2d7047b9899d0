"""The dashboard in headless Chromium against a real `tenure up` with API keys (tenant-a, tenant-b, the admin).

Each test drives the pages as a person does — a key typed into the login form, buttons clicked, the live parts
watched without a reload — and every page's screenshot is taken (written to docs/images/, which
docs/dashboard.md shows, when TENURE_TEST_SCREENSHOTS=1).
Every response the browser gets is recorded, and no page may have received a 5xx."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, Response, async_playwright, expect

from tests.acceptance.up import ADMIN_KEY, KEYS, Up, descendants
from tests.browser.test_event_source import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# Screenshots go to docs/images/ (shown by docs/dashboard.md) when TENURE_TEST_SCREENSHOTS=1, else to a scratch
# directory: every page is still rendered and captured, but a plain `make test` leaves the work tree clean.
IMAGES = (
    ROOT / "docs" / "images"
    if os.environ.get("TENURE_TEST_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "tenure-test-screenshots"
)
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("dashboard")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=2, env={"TENURE_QUOTAS": "llm:mock=2"})
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


class Session:
    """One browser context signed in with one key, recording every response its pages got."""

    def __init__(self, context: BrowserContext, page: Page, base: str) -> None:
        self.context = context
        self.page = page
        self.base = base
        self.failures: list[str] = []
        page.on("response", self._record)

    def _record(self, r: Response) -> None:
        if r.status >= 500:
            self.failures.append(f"{r.status} {r.url}")

    async def goto(self, path: str) -> None:
        await self.page.goto(self.base + path)

    async def shot(self, name: str, full_page: bool = False) -> None:
        IMAGES.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(IMAGES / f"{name}.png"), full_page=full_page)


async def sign_in(browser: Browser, up: Up, key: str, viewport: dict[str, int] = DESKTOP) -> Session:
    context = await browser.new_context(viewport=viewport)  # type: ignore[arg-type]
    page = await context.new_page()
    s = Session(context, page, up.url)
    await s.goto("/")
    await expect(page).to_have_url(f"{up.url}/ui/login?next=%2Fui")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(f"{up.url}/ui")
    return s


async def api(up: Up, method: str, path: str, tenant: str | None = "tenant-a", **kw: Any) -> Any:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(tenant), timeout=30) as c:
        r = await c.request(method, path, **kw)
        r.raise_for_status()
        return r.json()


async def wait_state(up: Up, job_id: str, states: set[str], tenant: str = "tenant-a") -> dict[str, Any]:
    async with asyncio.timeout(30):
        while (job := await api(up, "GET", f"/v1/jobs/{job_id}", tenant))["state"] not in states:
            await asyncio.sleep(0.05)
    return job  # type: ignore[no-any-return]


async def test_a_tenant_signs_in_and_a_job_submitted_over_the_api_appears_without_a_reload(up: Up, browser: Browser) -> None:
    s = await sign_in(browser, up, KEYS["tenant-a"])
    await expect(s.page.get_by_test_id("who")).to_have_text("tenant tenant-a")
    await s.shot("overview")
    await s.goto("/ui/jobs")
    await s.page.evaluate("window.notReloaded = true")
    job = await api(up, "POST", "/v1/jobs", json={"agent": "sleep", "input": {"seconds": 1.5}})
    row = s.page.locator(f'tr[data-job="{job["id"]}"]')
    await expect(row).to_be_visible(timeout=5000)
    await expect(row).to_contain_text("sleep")
    await expect(row).to_contain_text("succeeded", timeout=10000)  # the live list follows its state too
    assert await s.page.evaluate("window.notReloaded") is True
    await expect(s.page.get_by_test_id("count-succeeded")).not_to_have_text("0")
    await s.shot("jobs")
    # The session cookie is HttpOnly and SameSite=Strict: no script reads it.
    (cookie,) = [c for c in await s.context.cookies() if c["name"] == "tenure_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "tenure_session" not in await s.page.evaluate("document.cookie")
    assert not s.failures, s.failures


async def test_a_job_page_streams_the_jobs_events_live(up: Up, browser: Browser) -> None:
    s = await sign_in(browser, up, KEYS["tenant-a"])
    job = await api(up, "POST", "/v1/jobs", json={"agent": "converse"})
    await wait_state(up, job["id"], {"waiting"})
    await s.goto(f"/ui/jobs/{job['id']}")
    events = s.page.get_by_test_id("events")
    await expect(events).to_contain_text("job.waiting")
    for said in ("hello", "again"):
        await api(up, "POST", f"/v1/jobs/{job['id']}/input", json={"input": said})
        await expect(events).to_contain_text(said)  # streamed in, no reload
    await expect(s.page.get_by_role("button", name="Approve")).to_be_visible()  # it waits: its buttons show
    await s.shot("job", full_page=True)
    # Sent from the page itself: its button posts to the API's own route with the session.
    await s.page.get_by_label("Input (JSON)").fill('"bye"')
    await s.page.get_by_role("button", name="Send input").click()
    await expect(s.page.get_by_test_id("outcome")).to_have_text("input: requested")
    await expect(events).to_contain_text("job.succeeded")
    await expect(s.page.get_by_test_id("job-state")).to_contain_text("succeeded")
    history = (await api(up, "GET", f"/v1/jobs/{job['id']}/events", params={"format": "json"}))["events"]
    shown = await s.page.locator("#events li").evaluate_all("els => els.map(e => e.dataset.id)")
    assert shown == [e["id"] for e in history]  # the stream resumed by cursor: no gap, no duplicate
    await expect(s.page.get_by_test_id("cursor")).to_have_text(history[-1]["id"])
    assert not s.failures, s.failures


async def test_cancelling_a_running_job_from_its_page_shows_the_outcome_and_cancelled(up: Up, browser: Browser) -> None:
    s = await sign_in(browser, up, KEYS["tenant-a"])
    job = await api(up, "POST", "/v1/jobs", json={"agent": "sleep", "input": {"seconds": 60, "every": 0.5}})
    await wait_state(up, job["id"], {"running"})
    await s.goto(f"/ui/jobs/{job['id']}")
    await expect(s.page.get_by_test_id("job-state")).to_contain_text("running")
    # Keyboard only: the Cancel button is reachable with Tab and pressed with Enter.
    for _ in range(60):
        await s.page.keyboard.press("Tab")
        if await s.page.evaluate("document.activeElement?.dataset?.action") == "cancel":
            break
    else:
        raise AssertionError("the Cancel button is not reachable with the keyboard")
    await s.page.keyboard.press("Enter")
    await expect(s.page.get_by_test_id("outcome")).to_contain_text("cancel: accepted", timeout=15000)
    await expect(s.page.get_by_test_id("job-state")).to_contain_text("cancelled", timeout=10000)
    assert (await api(up, "GET", f"/v1/jobs/{job['id']}"))["state"] == "cancelled"
    assert not s.failures, s.failures


async def test_a_dead_job_is_requeued_from_the_dead_letters(up: Up, browser: Browser) -> None:
    s = await sign_in(browser, up, KEYS["tenant-a"])
    body = {"agent": "flaky", "input": {"fail_times": 1}, "max_attempts": 1}
    job = await api(up, "POST", "/v1/jobs", json=body)
    await wait_state(up, job["id"], {"dead"})
    await s.goto("/ui/dead")
    row = s.page.locator(f'tr[data-job="{job["id"]}"]')
    await expect(row).to_contain_text("flaky")
    await s.shot("dead-letters")
    await s.page.get_by_label(f"Select job {job['id'][:8]}").check()
    await s.page.get_by_role("button", name="Requeue selected").click()
    await expect(s.page.get_by_test_id("outcome")).to_have_text("requeued 1 of 1")
    await expect(row).to_have_count(0)
    # It ran again at a new epoch (with fresh attempts its first attempt fails again, so it may well be dead again).
    again = await wait_state(up, job["id"], {"dead", "succeeded"})
    events = (await api(up, "GET", f"/v1/jobs/{job['id']}/events", params={"format": "json"}))["events"]
    assert "job.requeued" in [e["type"] for e in events] and again["epoch"] == 2
    assert not s.failures, s.failures


async def test_a_second_tenant_does_not_see_the_first_tenants_jobs(up: Up, browser: Browser) -> None:
    body = {"agent": "echo", "input": {"secret": 1}}
    job = await api(up, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": "a-42"})
    b = await sign_in(browser, up, KEYS["tenant-b"])
    await b.goto("/ui/jobs")
    await expect(b.page.locator("#jobs")).to_be_visible()
    assert job["id"] not in await b.page.content()
    await b.goto(f"/ui/jobs?q={job['id']}")
    await expect(b.page.locator("#jobs")).to_contain_text("No jobs match.")
    await b.goto("/ui/jobs?q=a-42")  # the idempotency key of tenant-a's job: tenant-b's own key space
    await expect(b.page.locator("#jobs")).to_contain_text("No jobs match.")
    response = await b.page.goto(f"{up.url}/ui/jobs/{job['id']}")
    assert response is not None and response.status == 404
    # The page's own API calls are scoped the same way.
    status = await b.page.evaluate(f"fetch('/v1/jobs/{job['id']}').then(r => r.status)")
    assert status == 404
    a = await sign_in(browser, up, KEYS["tenant-a"])
    await a.goto("/ui/jobs?q=a-42")
    await expect(a.page.locator(f'tr[data-job="{job["id"]}"]')).to_be_visible()
    admin = await sign_in(browser, up, ADMIN_KEY)
    await admin.goto(f"/ui/jobs?q={job['id'][:13]}")  # an id prefix, as the admin: every tenant
    await expect(admin.page.locator(f'tr[data-job="{job["id"]}"]')).to_contain_text("tenant-a")
    assert not (a.failures or b.failures or admin.failures)


async def test_every_filter_the_jobs_page_offers_answers_without_a_server_error(up: Up, browser: Browser) -> None:
    admin = await sign_in(browser, up, ADMIN_KEY)
    await admin.goto("/ui/jobs")
    states = await admin.page.locator('select[name="state"] option').evaluate_all("os => os.map(o => o.value)")
    tenants = await admin.page.locator('select[name="tenant"] option').evaluate_all("os => os.map(o => o.value)")
    assert "dead" in states and "tenant-a" in tenants
    for state in states:
        for tenant in ("", "tenant-a"):
            for agent in ("", "sleep", "\u00e9\U0001f600", "x" * 300, "%00"):
                await admin.page.goto(f"{up.url}/ui/jobs?" + str(httpx.QueryParams(state=state, tenant=tenant, agent=agent)))
    for q in ("", "0", "0190", "not-a-key", "' OR 1=1 --", "\u0000", "ffffffff-ffff-ffff-ffff-ffffffffffff"):
        await admin.page.goto(f"{up.url}/ui/jobs?" + str(httpx.QueryParams(q=q)))
    for bad in ("state=nope", "before=xyz", "before=01234567-89ab-cdef-0123-456789abcdef", "limit=-1"):
        await admin.page.goto(f"{up.url}/ui/jobs?{bad}")
        await admin.page.goto(f"{up.url}/ui/dead?{bad}")
    for path in ("/ui", "/ui/workers", "/ui/workers?all=1", "/ui/quotas", "/ui/labs", "/ui/jobs/nope", "/ui/labs/nope"):
        await admin.page.goto(up.url + path)
    assert not admin.failures, admin.failures


async def test_the_pages_read_at_1280_px_and_at_a_phone_width(up: Up, browser: Browser) -> None:
    job = await api(up, "POST", "/v1/jobs", json={"agent": "sleep", "input": {"seconds": 0.2}})
    await wait_state(up, job["id"], {"succeeded"})
    admin = await sign_in(browser, up, ADMIN_KEY)
    await admin.goto("/ui/workers")
    await expect(admin.page.locator("#live tbody tr")).to_have_count(2)
    await admin.shot("workers")
    await admin.goto("/ui/quotas")
    await expect(admin.page.locator("h2 code")).to_have_text("llm:mock")
    await admin.shot("quotas")
    await admin.goto("/ui/labs")
    await admin.shot("labs")
    phone = await sign_in(browser, up, KEYS["tenant-a"], PHONE)
    for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job['id']}", "/ui/dead", "/ui/workers", "/ui/quotas"):
        await phone.goto(path)
        overflow = await phone.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{path} scrolls sideways by {overflow} px at 390 px"
    await phone.goto("/ui/jobs")
    await phone.shot("jobs-phone")
    # Readable without colour: each state is a word with a mark, not a colour alone.
    text = await phone.page.locator("#jobs").inner_text()
    assert "succeeded" in text
    assert not (admin.failures or phone.failures)


LEASE_FIGURE = ['[data-series="lease"]', '[data-series="counter"]', "[data-crash]"]


def _lab_processes(up: Up) -> list[int]:
    out = []
    for pid in descendants(up.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"tenure-lab-" in cmd or b"tenure.demos.labs" in cmd:
            out.append(pid)
    return out


@pytest.mark.parametrize(
    ("lab", "params", "figure", "conclusion"),
    [
        ("loop", {"jobs": 3, "block_ms": 300, "blocks": 4}, ['[data-series="thread"]', '[data-series="loop"]'], "late"),
        ("owner", {"short_jobs": 4}, ["[data-frozen]", 'rect[data-epoch="2"]'], "refused"),
        ("lease", {"limit": 3, "crash_rate": 0.4, "seconds": 10}, LEASE_FIGURE, "ghost"),
    ],
)
async def test_each_lab_runs_to_its_conclusion_and_shows_its_figure(
    up: Up, browser: Browser, lab: str, params: dict[str, float], figure: list[str], conclusion: str
) -> None:
    admin = await sign_in(browser, up, ADMIN_KEY)
    await admin.goto(f"/ui/labs/{lab}")
    for name, value in params.items():
        await admin.page.locator(f'input[name="{name}"]').fill(str(value))
    started = time.monotonic()
    await admin.page.get_by_role("button", name="Run the lab").click()
    await expect(admin.page.get_by_test_id("lab-result")).to_contain_text(conclusion, timeout=90000)
    for selector in figure:
        await expect(admin.page.get_by_test_id("figure").locator(selector).first).to_be_attached()
    await expect(admin.page.get_by_test_id("lab-status")).to_have_text("finished", timeout=20000)
    await admin.shot(f"lab-{lab}")
    assert time.monotonic() - started < 90
    # The lab cleaned up: no process of it is left, and its directory is gone.
    async with asyncio.timeout(15):
        while _lab_processes(up):
            await asyncio.sleep(0.2)
    assert not list(Path("/tmp").glob(f"tenure-lab-{lab}-*"))
    # A tenant may not start one.
    tenant = await sign_in(browser, up, KEYS["tenant-a"])
    status = await tenant.page.evaluate(
        f"""fetch('/ui/api/labs/{lab}', {{method: 'POST', headers: {{'X-Tenure-CSRF':
            document.querySelector('meta[name=csrf]').content, 'Content-Type': 'application/json'}}, body: '{{}}'}})
            .then(r => r.status)"""
    )
    assert status == 403
    assert not admin.failures, admin.failures
