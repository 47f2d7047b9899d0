"""The worker process: claims, starts, runs and finishes jobs; heartbeats; holds the sweeper duty."""

from tenure.worker.config import WorkerConfig
from tenure.worker.worker import Worker

__all__ = ["Worker", "WorkerConfig"]
