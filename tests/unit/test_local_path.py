"""The local fast path's room (control/routing.LocalPath): jobs routed to the inline worker count against its free
slots until it claims them or their grace ends; it takes only what it can run, while it is active."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tenure.contracts.states import WorkerState
from tenure.control.routing import LocalPath


@dataclass
class Inline:
    id: str = "gw:1:inline"
    agents: list[str] = field(default_factory=lambda: ["echo"])
    state: WorkerState = WorkerState.ACTIVE
    free: int = 2
    tags: tuple[str, ...] = ("text/*", "feature:gpu")

    def free_slots(self) -> int:
        return self.free

    def claim_tags(self) -> tuple[str, ...]:
        return self.tags


def test_routed_jobs_hold_room_until_claimed_or_their_grace_ends() -> None:
    w = Inline()
    local = LocalPath(w, 2)
    assert local.take("echo", frozenset(), "j1", 60.0) and local.take("echo", frozenset(), "j2", 60.0)
    assert not local.take("echo", frozenset(), "j3", 60.0)  # two slots, two jobs on their way
    local.claimed("j1")
    w.free = 1  # j1 holds a slot of its own now
    assert not local.take("echo", frozenset(), "j3", 60.0)  # j2 still on its way to the one free slot
    local.claimed("j2")
    w.free = 2  # both finished
    assert local.take("echo", frozenset(), "j3", 0.01)
    time.sleep(0.02)  # j3's grace ended unclaimed (another worker took it): it holds no room
    assert local.take("echo", frozenset(), "j4", 60.0) and local.take("echo", frozenset(), "j5", 60.0)
    assert local.routed == 5


def test_only_what_it_can_run_and_only_while_active() -> None:
    w = Inline()
    local = LocalPath(w, 2)
    assert not local.take("other", frozenset(), "a", 60.0)  # an agent it does not serve
    assert not local.take("echo", frozenset({"image/ocr"}), "b", 60.0)  # a capability it does not offer
    assert local.take("echo", frozenset({"text/summarize", "feature:gpu"}), "c", 60.0)  # text/* and its feature
    for state in (WorkerState.DRAINING, WorkerState.UNHEALTHY, WorkerState.WARMING, WorkerState.DEGRADED):
        w.state = state
        assert not local.take("echo", frozenset(), "d", 60.0), state
