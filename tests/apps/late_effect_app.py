"""Test agent: a side effect that comes after a wait (the shape of most agents: think, then act)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tenure import Context, Tenure

app = Tenure("late-effect")


def _touch(path: str) -> None:
    with open(path, "a") as f:
        f.write("effect\n")


@app.agent("late_effect", timeout=120, max_attempts=1)
async def late_effect(ctx: Context, input: Any) -> dict[str, Any]:
    """Emit `waiting`, sleep `seconds`, then append one line to the file `counter` (the external effect)."""
    await ctx.emit("waiting")
    await asyncio.sleep(float(input["seconds"]))
    await ctx.to_thread(_touch, str(Path(input["counter"])))
    return {"done": True}
