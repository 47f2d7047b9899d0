"""What a coordinator knows of its children (docs/coordinators.md): a child job as its parent's reads see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenure.contracts.states import JobState


@dataclass(frozen=True, slots=True)
class ChildJob:
    """One child of a coordinator job: its id, agent and state (`JobStore.children`), in spawn order."""

    id: str
    agent: str
    state: JobState

    def to_dict(self) -> dict[str, Any]:
        """As `GET /v1/jobs/{id}` lists it under `children`."""
        return {"id": self.id, "agent": self.agent, "state": self.state.value}
