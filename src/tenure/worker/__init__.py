"""The worker process: claims, starts, runs and finishes jobs; heartbeats; holds the sweeper duty."""

from tenure.worker.worker import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
