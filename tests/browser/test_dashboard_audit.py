"""The job page's audit timeline and its requeue with an edited input, in headless Chromium against a real
`tenure up` (with keys) running the agent of tests/browser/audit_agents.py: tool calls, evidence, a journal
step and usage per attempt, priced by TENURE_PRICES.

Every response the browser gets is recorded (test_dashboard.Session), and no page may have received a 5xx."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.async_api import Browser, expect

from tenure.gateway.ui.timeline import record_url
from tests.acceptance.up import KEYS, Up
from tests.browser.test_dashboard import DESKTOP, IMAGES, PHONE, api, browser, sign_in, wait_state

pytestmark = pytest.mark.slow
__all__ = ["browser"]  # the fixture, imported for these tests

PRICES = {"gpt-test": {"input": 0.001, "output": 0.002}}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("dashboard-audit")
    env = {"TENURE_PRICES": json.dumps(PRICES)}
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, app="tests.browser.audit_agents:app", env=env)
    yield server
    assert server.stop() == 0, server.log()


async def test_the_job_page_shows_the_audit_timeline_of_three_executions_after_two_retries(up: Up, browser: Browser) -> None:
    budget = {"tool_calls": 50, "tokens": 10000, "cost": 1}
    job = await api(up, "POST", "/v1/jobs", json={"agent": "auditee", "input": {"succeed_on": 3}, "budget": budget})
    await wait_state(up, job["id"], {"succeeded"})
    executions = (await api(up, "GET", f"/v1/jobs/{job['id']}/audit"))["executions"]
    s = await sign_in(browser, up, KEYS["tenant-a"])
    await s.goto(f"/ui/jobs/{job['id']}")
    attempts = s.page.get_by_test_id("audit-execution")
    await expect(attempts).to_have_count(3)
    for n, (shown, e) in enumerate(zip(await attempts.all(), executions, strict=True), start=1):
        await expect(shown.locator("h3")).to_contain_text(f"Attempt {n}")
        await expect(shown.locator("h3")).to_contain_text("succeeded" if n == 3 else "failed")
        await expect(shown.get_by_test_id("execution-worker")).to_have_text(e["worker_id"])
        # Under each: its two tool calls (one result, one error), its evidence and its usage, in order.
        calls = shown.get_by_test_id("audit-tool-call")
        await expect(calls).to_have_count(2)
        await expect(calls.nth(0)).to_contain_text("search ✓ returned")
        await expect(calls.nth(0)).to_contain_text(f'{{"attempt": {n}, "q": "tenure"}}')
        await expect(calls.nth(0)).to_contain_text('{"hits": 3, "q": "tenure"}')
        await expect(calls.nth(1).get_by_test_id("tool-error")).to_have_text("ConnectionError: refused")
        usage = shown.get_by_test_id("audit-usage")
        await expect(usage).to_contain_text(f"gpt-test: {100 * n + 10} tokens ({100 * n} in, 10 out)")
        await expect(usage).to_contain_text(f"cost {(0.1 * n + 0.02) / 1000:.6g} USD")
        # The evidence is long: a preview, and the whole of it behind a disclosure reached with the keyboard.
        evidence = shown.get_by_test_id("audit-evidence")
        whole = evidence.locator("details pre")
        await expect(whole).not_to_be_visible()
        await evidence.locator("summary").focus()
        await s.page.keyboard.press("Enter")
        await expect(whole).to_be_visible()
        assert json.loads(await whole.inner_text())["attempt"] == n
    # The journal step ran in the first attempt only; the later ones found it done.
    steps = s.page.get_by_test_id("audit-step")
    await expect(steps).to_have_count(1)
    await expect(attempts.nth(0).get_by_test_id("audit-step")).to_contain_text("draft ✓ done")
    totals = s.page.get_by_test_id("usage-totals")
    for text in ("input_tokens600", "output_tokens30", "cost_usd0.00066"):
        await expect(totals).to_contain_text(text)
    budget_table = s.page.get_by_test_id("budget")
    for limit, cells in (("tool_calls", ["50 tool calls", "6", "44"]), ("tokens", ["10,000 tokens", "630", "9,370"])):
        row = budget_table.locator(f'tr[data-limit="{limit}"] td')
        for i, text in enumerate(cells, start=1):
            await expect(row.nth(i)).to_have_text(text)
    IMAGES.mkdir(parents=True, exist_ok=True)
    await s.page.locator("#audit").screenshot(path=str(IMAGES / "job-audit.png"))
    phone = await sign_in(browser, up, KEYS["tenant-a"], PHONE)
    await phone.goto(f"/ui/jobs/{job['id']}")
    overflow = await phone.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the job page scrolls sideways by {overflow} px at 390 px"
    assert not (s.failures or phone.failures), s.failures + phone.failures


async def test_a_long_audit_is_paged_with_the_audit_cursor(up: Up, browser: Browser) -> None:
    job = await api(up, "POST", "/v1/jobs", json={"agent": "auditee", "input": {"succeed_on": 2, "extra": 6}})
    await wait_state(up, job["id"], {"succeeded"})
    audit = await api(up, "GET", f"/v1/jobs/{job['id']}/audit", params={"limit": 1000})
    want = sorted(f"{r['epoch']}.{r['seq']}" for k in ("tool_calls", "evidence", "usage") for r in audit[k])
    assert len(want) == 2 * 10
    s = await sign_in(browser, up, KEYS["tenant-a"], DESKTOP)
    await s.goto(f"/ui/jobs/{job['id']}?audit_limit=3")
    seen: list[str] = []
    for _ in range(20):
        seen += await s.page.locator("#audit .rec").evaluate_all("els => els.map(e => e.dataset.key)")
        more = s.page.get_by_test_id("audit-next")
        if not await more.count():
            break
        await more.click()
        await expect(s.page.get_by_test_id("audit-first")).to_be_visible()
    assert sorted(seen) == want and len(seen) == len(set(seen))  # every record once: no gap, no duplicate
    # Each record's own link (offered for a value too long for the page) is the API's page of that one record.
    for key in want[:4] + want[-4:]:
        epoch, seq = map(int, key.split("."))
        url = record_url(job["id"], epoch, seq)
        one = await api(up, "GET", url.partition("?")[0], params=dict(httpx.QueryParams(url.partition("?")[2])))
        assert [f"{r['epoch']}.{r['seq']}" for k in ("tool_calls", "evidence", "usage") for r in one[k]] == [key]
    # The executions whose records are all elsewhere say so.
    await expect(s.page.locator("#audit")).to_contain_text("Its records are on an earlier page of the audit.")
    for bad in ("audit=nope", "audit=1.2.3", "audit_limit=0", "audit_limit=x", "audit_limit=5000"):
        response = await s.page.goto(f"{up.url}/ui/jobs/{job['id']}?{bad}")
        assert response is not None and response.status == 400
    assert not s.failures, s.failures


async def test_a_dead_job_is_requeued_with_an_edited_input_from_its_page(up: Up, browser: Browser) -> None:
    job = await api(up, "POST", "/v1/jobs", json={"agent": "auditee", "input": {"q": "first", "succeed_on": 9}})
    await wait_state(up, job["id"], {"dead"})
    s = await sign_in(browser, up, KEYS["tenant-a"])
    await s.goto("/ui/dead")
    await s.page.locator(f'tr[data-job="{job["id"]}"]').get_by_role("link", name="Edit the input…").click()
    await expect(s.page).to_have_url(re.compile(f"/ui/jobs/{job['id']}#requeue-edit$"))
    await s.page.evaluate("window.notReloaded = true")
    area = s.page.get_by_label("New input (as JSON)")
    assert json.loads(await area.input_value()) == {"q": "first", "succeed_on": 9}
    message = s.page.get_by_test_id("requeue-message")
    send = s.page.get_by_role("button", name="Requeue with this input", exact=True)
    # Not JSON: the gateway says why, nothing is requeued.
    await area.fill('{"q": "second", ')
    await send.click()
    await expect(message).to_contain_text("The input is not valid JSON")
    await expect(message).to_contain_text("(nothing was requeued)")
    await expect(area).to_have_attribute("aria-invalid", "true")
    await s.page.locator("#requeue-edit").screenshot(path=str(IMAGES / "job-requeue-edit.png"))
    await area.fill("")
    await send.click()
    await expect(message).to_contain_text("The input is empty")
    await area.fill('{"q": NaN}')
    await send.click()
    await expect(message).to_contain_text("The input is not valid JSON")
    assert (await api(up, "GET", f"/v1/jobs/{job['id']}"))["state"] == "dead"
    # The page's CSRF rule holds for this change too: without the session's token, refused.
    status = await s.page.evaluate(
        f"""fetch('/ui/api/jobs/{job["id"]}/requeue', {{method: 'POST', headers: {{'Content-Type': 'application/json'}},
            body: JSON.stringify({{input: '{{}}'}})}}).then(r => r.status)"""
    )
    assert status == 403
    # JSON: requeued with it, it runs again and succeeds; the page follows without a reload.
    await area.fill('{"q": "second", "succeed_on": 1}')
    await send.click()
    await expect(message).to_contain_text("requeued with the edited input")
    await expect(s.page.get_by_test_id("job-state")).to_contain_text("succeeded", timeout=15000)
    await expect(s.page.get_by_test_id("job-input")).to_contain_text('"second"')
    await expect(s.page.get_by_test_id("job-result")).to_contain_text('"second"')
    # The edit is in the timeline, after the three attempts it followed and before the fourth.
    attempts = s.page.get_by_test_id("audit-execution")
    await expect(attempts).to_have_count(4)
    edit = attempts.nth(2).get_by_test_id("audit-edit")
    await expect(edit.get_by_test_id("edit-previous")).to_contain_text('"q": "first"')
    await expect(edit.get_by_test_id("edit-input")).to_contain_text('"q": "second"')
    await expect(attempts.nth(3).get_by_test_id("audit-tool-call").first).to_contain_text('"q": "second"')
    await expect(s.page.locator("#requeue-edit")).to_be_hidden()
    assert await s.page.evaluate("window.notReloaded") is True
    after = await api(up, "GET", f"/v1/jobs/{job['id']}")
    assert after["input"] == {"q": "second", "succeed_on": 1} and after["epoch"] == 4
    # Another tenant can neither see this job's page nor requeue it.
    b = await sign_in(browser, up, KEYS["tenant-b"])
    response = await b.page.goto(f"{up.url}/ui/jobs/{job['id']}")
    assert response is not None and response.status == 404
    status = await b.page.evaluate(
        f"""fetch('/ui/api/jobs/{job["id"]}/requeue', {{method: 'POST', headers: {{'Content-Type': 'application/json',
            'X-Tenure-CSRF': document.querySelector('meta[name=csrf]').content}}, body: JSON.stringify({{input: '1'}})}})
            .then(r => r.status)"""
    )
    assert status == 404
    assert not (s.failures or b.failures), s.failures + b.failures
