"""What one worker holds right now: claims not yet started, and started executions, by job id.

The heartbeat renews all of them in one round trip and learns which are no longer this worker's; the control
fast path finds the execution a cancel or a command is for; the claim loop adds claims and launches
executions; an execution takes itself out when it ends.
"""

from __future__ import annotations

import logging

from tenure.contracts.types import Claim, Fence
from tenure.worker.execution import Execution
from tenure.worker.slots import Slots

log = logging.getLogger("tenure.worker")


class Held:
    """Claims (`claimed`, not started) and executions (`running`) of one worker."""

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self.claimed: dict[str, Claim] = {}
        self.running: dict[str, Execution] = {}

    def fences(self) -> list[Fence]:
        """The fence of everything held, for the heartbeat."""
        return [c.fence for c in self.claimed.values()] + [e.fence for e in self.running.values()]

    def __len__(self) -> int:
        return len(self.claimed) + len(self.running)

    def holds(self, fence: Fence) -> bool:
        """Whether `fence` is still what this worker holds for its job (not an older claim of the same job)."""
        current = self.running.get(fence.job_id) or self.claimed.get(fence.job_id)
        return current is not None and current.fence == fence

    def lose(self, job_id: str) -> None:
        """This worker no longer owns `job_id`: give up its claim, or stop its execution (nothing more written)."""
        if self.claimed.pop(job_id, None) is not None:
            self._slots.free()
            log.warning("claim of job %s was lost before it started", job_id)
            return
        execution = self.running.get(job_id)
        if execution is not None:
            execution.lose()

    def cancel(self, job_id: str) -> None:
        """A cancel request for `job_id`: its execution stops and finishes `cancelled`."""
        execution = self.running.get(job_id)
        if execution is not None:
            execution.cancel()

    def ended(self, job_id: str) -> None:
        """An execution ended (its finish written, or nothing to write)."""
        self.running.pop(job_id, None)
