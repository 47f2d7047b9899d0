"""Structured logs, lag-aware liveness decisions and multiprocess aggregation, without a worker."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tenure.contracts.states import WorkerState
from tenure.observability.logs import bind_log_context, job_context, setup_logging
from tenure.worker.observe import WorkerObserver


@pytest.fixture
def restore_logging() -> Any:
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_logs_are_one_object_per_line_with_the_job_fields(restore_logging: None) -> None:
    import logging

    out = io.StringIO()
    setup_logging("info", "auto", out)  # a StringIO is no terminal: auto means JSON
    with job_context(job_id="j1", worker_id="w1", agent="echo", epoch=2):
        logging.getLogger("tenure.test").info(
            "job %s", "succeeded", extra={"state": "succeeded", "duration_ms": 12.5, "error_code": None}
        )
    logging.getLogger("tenure.test").warning("outside")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["msg"] == "job succeeded" and first["level"] == "info" and first["logger"] == "tenure.test"
    assert {k: first[k] for k in ("job_id", "worker_id", "agent", "epoch", "state", "duration_ms")} == {
        "job_id": "j1",
        "worker_id": "w1",
        "agent": "echo",
        "epoch": 2,
        "state": "succeeded",
        "duration_ms": 12.5,
    }
    assert "job_id" not in second  # the context ended with the block


def test_process_fields_reach_lines_logged_from_threads(restore_logging: None) -> None:
    import logging
    import threading

    from tenure.observability import logs

    out = io.StringIO()
    setup_logging("info", "json", out)
    saved = dict(logs._process_fields)
    try:
        logs.set_process_log_fields(role="worker", worker_id="w-proc")
        thread = threading.Thread(target=lambda: logging.getLogger("tenure.lag").warning("stall"))
        thread.start()
        thread.join()
    finally:
        logs._process_fields.clear()
        logs._process_fields.update(saved)
    record = json.loads(out.getvalue().splitlines()[0])
    assert record["worker_id"] == "w-proc" and record["role"] == "worker"


def test_console_logs_put_the_known_fields_first_in_a_readable_line(restore_logging: None) -> None:
    import logging

    out = io.StringIO()
    setup_logging("debug", "console", out)
    logging.getLogger("tenure.test").info("job started", extra={"state": "running", "job_id": "j9", "zzz": 1})
    line = out.getvalue().strip()
    assert "INFO" in line and "job started" in line
    assert line.index("job_id=j9") < line.index("state=running") < line.index("zzz=1")


async def test_the_log_context_of_a_job_follows_its_calls_into_the_adapter_threads(
    restore_logging: None,
) -> None:
    import asyncio
    import logging

    from tenure.kernel.blocking import BlockingAdapter

    out = io.StringIO()
    setup_logging("info", "json", out)
    adapter = BlockingAdapter("t", 1, 1, 5.0)

    async def job() -> None:
        bind_log_context(job_id="j7", execution_id="e7")
        await adapter.run(logging.getLogger("tenure.test").info, "from a thread")

    await asyncio.create_task(job())
    await adapter.close(5.0)
    record = json.loads(out.getvalue().splitlines()[0])
    assert record["job_id"] == "j7" and record["execution_id"] == "e7"


class _Sampler:
    def __init__(self) -> None:
        self.running = True
        self.is_degraded = False
        self.max_lag = 0.0
        self.current_lag = 0.0

    def degraded(self, threshold_s: float, for_s: float) -> bool:
        return self.is_degraded

    def max_lag_window(self, window_s: float | None = None) -> float:
        return self.max_lag


def test_liveness_turns_degraded_on_lasting_lag_and_active_only_once_the_lag_stayed_low() -> None:
    obs = WorkerObserver(
        "w-liveness", heartbeat_s=1, lag_interval_s=0.05, stall_threshold_s=0.1, degraded_lag_s=0.5, degraded_for_s=2.0
    )
    sampler = _Sampler()
    obs.sampler = sampler  # type: ignore[assignment]
    assert obs.liveness(WorkerState.ACTIVE) is WorkerState.ACTIVE
    sampler.is_degraded, sampler.max_lag = True, 3.0
    assert obs.liveness(WorkerState.ACTIVE) is WorkerState.DEGRADED
    sampler.is_degraded = False  # the stall ended, but the window still shows it: stay degraded
    assert obs.liveness(WorkerState.DEGRADED) is WorkerState.DEGRADED
    sampler.max_lag = 0.01
    assert obs.liveness(WorkerState.DEGRADED) is WorkerState.ACTIVE
    sampler.is_degraded = True  # draining and gone are never overridden by lag
    assert obs.liveness(WorkerState.DRAINING) is WorkerState.DRAINING
    obs.close()


def test_liveness_counts_a_loop_blocked_most_of_the_time_as_degraded_despite_short_on_time_gaps() -> None:
    obs = WorkerObserver(
        "w-share", heartbeat_s=1, lag_interval_s=0.05, stall_threshold_s=0.1, degraded_lag_s=0.3, degraded_for_s=2.0
    )
    sampler = _Sampler()
    obs.sampler = sampler  # type: ignore[assignment]
    obs._on_lag_sample(0.4)  # one 0.4 s stall in 2 s: 20 %, not degraded
    obs._on_lag_sample(0.001)
    assert obs.late_share() < 0.5 and obs.liveness(WorkerState.ACTIVE) is WorkerState.ACTIVE
    for _ in range(2):  # 1.2 s of stalls over 0.3 s in the window, with on-time ticks between them
        obs._on_lag_sample(0.4)
        obs._on_lag_sample(0.001)
    assert obs.late_share() >= 0.5 and obs.liveness(WorkerState.ACTIVE) is WorkerState.DEGRADED
    obs.close()


def test_the_workers_gauge_counts_lost_workers_as_gone_but_not_drained_ones() -> None:
    from prometheus_client import REGISTRY

    from tenure.contracts.types import SweepReport, WorkerInfo

    obs = WorkerObserver(
        "w-registry", heartbeat_s=1, lag_interval_s=0.05, stall_threshold_s=0.1, degraded_lag_s=0.5, degraded_for_s=2.0
    )
    live = [WorkerInfo("a", "h", 1, 1, ()), WorkerInfo("b", "h", 2, 1, (), state=WorkerState.DEGRADED)]
    obs.registry_seen([*live, WorkerInfo("drained", "h", 3, 1, (), state=WorkerState.GONE)])
    assert REGISTRY.get_sample_value("tenure_workers", {"state": "gone"}) == 0
    assert REGISTRY.get_sample_value("tenure_workers", {"state": "degraded"}) == 1
    obs.swept(SweepReport(workers_gone=["silent"]))
    obs.registry_seen(live)
    assert REGISTRY.get_sample_value("tenure_workers", {"state": "gone"}) == 1
    assert REGISTRY.get_sample_value("tenure_workers", {"state": "active"}) == 1
    obs.close()


def test_a_worker_config_refuses_a_claim_ttl_under_three_heartbeats() -> None:
    from tenure.contracts.errors import ConfigError
    from tenure.worker import WorkerConfig

    WorkerConfig(heartbeat_s=0.1, claim_ttl_s=0.3)  # exactly three (despite 3 * 0.1 > 0.3 in floats)
    with pytest.raises(ConfigError, match="3 heartbeats"):
        WorkerConfig(heartbeat_s=1.0, claim_ttl_s=2.5)


def test_the_observability_settings_are_typed_like_the_others() -> None:
    from tenure.contracts.errors import ConfigError
    from tenure.settings import Settings

    s = Settings.from_env({"TENURE_LAG_INTERVAL_S": "0.1", "TENURE_DEGRADED_LAG_S": "1", "TENURE_METRICS_PORT": "0"})
    w = s.worker
    assert (w.lag_interval_s, w.degraded_lag_s, w.stall_threshold_s, w.degraded_for_s) == (0.1, 1.0, 0.25, 2.0)
    assert s.metrics_port == 0  # any free port
    with pytest.raises(ConfigError, match="port number"):
        Settings.from_env({"TENURE_METRICS_PORT": "eighty"})
    with pytest.raises(ConfigError, match="positive"):
        Settings.from_env({"TENURE_DEGRADED_FOR_S": "0"})
