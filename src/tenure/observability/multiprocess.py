"""prometheus_client's multiprocess mode for `tenure up` (one gateway and N workers on one machine).

Each process writes its metrics to memory-mapped files under `PROMETHEUS_MULTIPROC_DIR`; one endpoint (the
gateway's `/metrics`) aggregates them. The variable must be set **before** prometheus_client is imported
in the children, so the supervisor calls `prepare_multiprocess_dir()` before it starts them (they inherit
the environment), and `process_exited(pid)` when one exits. Histograms and counters add up across
processes; loop-lag and blocking metrics keep apart by their `worker` label; gauges use the
`multiprocess_mode` chosen in `tenure.observability.metrics` (`livemax` / `livesum`: dead processes drop out).

Wiring for the gateway engineer (a few lines in `tenure up`):

    from tenure.observability.multiprocess import prepare_multiprocess_dir, process_exited
    prepare_multiprocess_dir(run_dir / "metrics")   # before starting the children
    ...                                             # start gateway + workers (each passes role/worker labels)
    process_exited(child.pid)                       # in the supervisor, when a child ends
    # the gateway mounts tenure.observability.exposition.metrics_asgi_app(): in this mode it aggregates
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess

__all__ = ["ENV", "aggregate_registry", "loop_lag_by_worker", "prepare_multiprocess_dir", "process_exited"]

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` empty (stale files from an earlier run would be summed in) and export it as
    `PROMETHEUS_MULTIPROC_DIR` for the children this process starts. Blocking: call it before the loop."""
    directory = Path(path)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    os.environ[ENV] = str(directory)
    return directory


def process_exited(pid: int) -> None:
    """Tell prometheus_client that a child exited, so its `live*` gauges stop counting."""
    if os.environ.get(ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def aggregate_registry() -> CollectorRegistry:
    """A fresh registry whose collector reads every process's files (build one per scrape)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def loop_lag_by_worker() -> dict[str, float]:
    """The current `event_loop_lag_max_seconds` of each live worker process of this `tenure up`, by worker id,
    read from the metrics files (blocking: one file per process; call it off the loop). Empty outside it."""
    if not os.environ.get(ENV):
        return {}
    out: dict[str, float] = {}
    for family in aggregate_registry().collect():
        if family.name != "event_loop_lag_max_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("role") == "worker" and sample.labels.get("worker"):
                worker = sample.labels["worker"]
                out[worker] = max(out.get(worker, 0.0), float(sample.value))
    return out
