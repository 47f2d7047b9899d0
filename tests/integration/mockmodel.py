"""`tenure mock-model` as a subprocess for the tests that need a model with a hard concurrency limit: started
on a free port, its base URL read from the line it prints once it listens, killed afterwards."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest

import tenure.demos.mock_model


def start_mock_model(max_concurrency: int, latency_ms: float, tokens: int = 8) -> tuple[subprocess.Popen[str], str]:
    """`python -m tenure.demos.mock_model` on a free port: the process and its base URL (`.../v1`)."""
    src = Path(tenure.demos.mock_model.__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenure.demos.mock_model",
            "--port",
            "0",
            "--max-concurrency",
            str(max_concurrency),
            "--latency-ms",
            str(latency_ms),
            "--tokens",
            str(tokens),
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=30):
            process.kill()
            pytest.fail("the mock model did not start within 30 s")
    line = process.stdout.readline()
    assert line.startswith("mock model listening on http://"), line
    return process, line.rsplit(" ", 1)[1].strip().rstrip("/") + "/v1"


def stop_process(process: subprocess.Popen[str]) -> None:
    """Kill the mock model (if still running) and close its pipe."""
    if process.poll() is None:
        process.kill()
    process.wait(10)
    if process.stdout is not None:
        process.stdout.close()
