"""An app with a warm-up (tests/integration/test_broker.py): `WARM_APP_SECONDS` of loading, or, with
`WARM_APP_FAIL` set, a warm-up that raises."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tenure

app = tenure.Tenure("warm")


@app.warmup
async def load_model() -> None:
    await asyncio.sleep(float(os.environ.get("WARM_APP_SECONDS", "0")))
    if os.environ.get("WARM_APP_FAIL"):
        raise RuntimeError("the model file is missing")


@app.agent("echo")
async def echo(ctx: tenure.Context, input: Any) -> Any:
    return input
