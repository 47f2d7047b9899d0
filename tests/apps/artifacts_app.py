"""Test agents of results and evidence by reference (tests/integration/test_artifacts.py, docs/artifacts.md)."""

from __future__ import annotations

from typing import Any

from tenure import Context, Tenure

app = Tenure("artifacts")


def payload(size: int, seed: str = "") -> str:
    """`size` characters of text, different at every offset (a byte out of place changes the digest)."""
    line = [f"{seed}{i:011d}\n" for i in range(size // (12 + len(seed)) + 1)]
    return "".join(line)[:size]


@app.agent("big_result", timeout=120, max_attempts=1)
async def big_result(ctx: Context, input: Any) -> dict[str, Any]:
    """A result of about `input["size"]` bytes (its JSON text is a little more), built off the event loop."""
    return {"data": await ctx.to_thread(payload, int(input["size"]), str(input.get("seed", "")))}


@app.agent("big_evidence", timeout=120, max_attempts=1)
async def big_evidence(ctx: Context, input: Any) -> str:
    """Evidence of `input["size"]` characters, and a small result."""
    await ctx.evidence("report", await ctx.to_thread(payload, int(input["size"])))
    return "ok"
