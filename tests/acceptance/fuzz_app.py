"""A harmless app for fuzzing: agents whose inputs cannot make them block, sleep long or touch files."""

from __future__ import annotations

from typing import Any

from tenure import Context, Tenure

app = Tenure("fuzz")


@app.agent("echo")
async def echo(ctx: Context, input: Any) -> Any:
    """Return the input."""
    await ctx.emit("echo", {"size": len(repr(input))})
    return input
