"""Observability across processes: prometheus_client multiprocess mode as `tenure up` will use it, and the
one-call loop observability of non-worker processes (the gateway) with a real `/metrics` socket."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

_CHILD = """
import sys
from tenure.observability import metrics as m
m.JOBS_FINISHED.labels("echo", "succeeded").inc(int(sys.argv[1]))
m.LOOP_LAG_MAX.labels("worker", sys.argv[2]).set(float(sys.argv[3]))
"""


def test_multiprocess_mode_adds_counters_up_and_keeps_each_workers_lag_apart(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    code = (
        "import sys; from tenure.observability.multiprocess import prepare_multiprocess_dir; "
        f"prepare_multiprocess_dir({str(directory)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    for n, worker, lag in ((2, "a", "0.3"), (3, "b", "1.5")):
        subprocess.run([sys.executable, "-c", _CHILD, str(n), worker, lag], check=True, env=env, cwd=ROOT)
    render = "from tenure.observability.exposition import render; import sys; sys.stdout.write(render().decode())"
    text = subprocess.run(
        [sys.executable, "-c", render], check=True, env=env, cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert 'tenure_jobs_finished_total{agent="echo",state="succeeded"} 5.0' in text
    # livemax: the exited children are not marked dead here, so both lag curves are still present
    assert 'event_loop_lag_max_seconds{role="worker",worker="a"} 0.3' in text
    assert 'event_loop_lag_max_seconds{role="worker",worker="b"} 1.5' in text


async def test_observe_event_loop_is_the_gateways_one_call_lag_setup() -> None:
    import asyncio
    import time

    from tenure.monitoring import observe_event_loop

    async with observe_event_loop("gateway", "g-test", interval_s=0.02, stall_threshold_s=0.05, metrics_port=0) as sampler:
        await asyncio.sleep(0.1)
        time.sleep(0.2)  # noqa: ASYNC251 - the test (not tenure) blocks the loop on purpose
        await asyncio.sleep(0.1)
        assert sampler.max_lag_window() >= 0.15
        # The watcher thread closes the stall on its next look at the loop: on a loaded machine that can come
        # after the 0.1 s above (a CI run saw the stall logged only after this line).
        for _ in range(100):
            if sampler.stall_count >= 1:
                break
            await asyncio.sleep(0.05)
        assert sampler.stall_count >= 1
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("event_loop_lag_max_seconds", {"role": "gateway", "worker": "g-test"}) >= 0.15  # type: ignore[operator]
    assert REGISTRY.get_sample_value("tenure_loop_stalls_total", {"role": "gateway", "worker": "g-test"}) >= 1  # type: ignore[operator]
