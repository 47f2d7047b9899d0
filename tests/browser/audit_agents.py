"""The agent the dashboard's audit tests drive (tests/browser/test_dashboard_audit.py): every attempt records
tool calls (one returning, one raising), a journal step, a long piece of evidence and a usage report."""

from __future__ import annotations

from typing import Any

from tenure import Context, RetryableError, Tenure

app = Tenure("dashboard-audit")

LOREM = "lorem ipsum dolor sit amet " * 40


def _draft(topic: str) -> dict[str, Any]:
    return {"draft": f"about {topic}"}


@app.agent("auditee", timeout=60, max_attempts=3)
async def auditee(ctx: Context, input: Any) -> dict[str, Any]:
    """Attempts before `succeed_on` fail with a retryable error; `extra` more tool calls make a long audit."""
    q = str(input.get("q", "tenure"))
    async with ctx.tool_call("search", {"q": q, "attempt": ctx.attempt}) as call:
        call.result({"hits": 3, "q": q})
    try:
        async with ctx.tool_call("fetch", {"url": "http://example.invalid/"}):
            raise ConnectionError("refused")
    except ConnectionError:
        pass
    draft = await ctx.step("draft", _draft, q)  # journaled: run by the first attempt, found done by the others
    for n in range(int(input.get("extra", 0))):
        async with ctx.tool_call("lookup", {"n": n}) as call:
            call.result(n)
    await ctx.evidence("page", {"q": q, "attempt": ctx.attempt, "text": LOREM})
    ctx.usage(model="gpt-test", input_tokens=100 * ctx.attempt, output_tokens=10)
    if ctx.attempt < int(input.get("succeed_on", 1)):
        raise RetryableError(f"attempt {ctx.attempt} fails on purpose")
    return {"q": q, "attempt": ctx.attempt, "draft": draft}
