"""The agents admission knows from the live registry (docs/routing.md): every worker records the agents it
serves, with their admission defaults (contracts/profile.py), so a producer that never imported the workers'
code (`tenure submit`, a gateway started with another app, `tenure.connect`) admits their jobs as the workers'
app would.

`AgentDirectory` keeps one snapshot per admission door (one per process), read again at most every `ttl_s`
(2 s). A name it does not hold re-reads it sooner, at most every `miss_s` (0.25 s), so a worker that has just
registered is found by the next submit while a stream of unknown names costs at most four reads a second.

The same read carries every live worker's profile (state, capabilities, features, load, record): admission's
routing (control/scoring.py) scores from this snapshot, with no read of its own per job. `routed` counts the
jobs this door preferred to each worker since the snapshot was read, so that a burst does not pile onto the one
worker whose `in_flight` the snapshot shows lowest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from tenure.contracts.profile import specs_from_json
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, WorkerInfo

TTL_S = 2.0
MISS_S = 0.25


class AgentDirectory:
    """The agent specs of every worker not gone, read from the store at most every `ttl_s`."""

    def __init__(
        self, store: Store, *, ttl_s: float = TTL_S, miss_s: float = MISS_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._miss_s = miss_s
        self._clock = clock
        self._specs: dict[str, AgentSpec] = {}
        self._workers: tuple[WorkerInfo, ...] = ()
        self.routed: dict[str, int] = {}
        """Jobs this door preferred to each worker since the snapshot was read (reset by each read)."""
        self._read_at: float | None = None
        self._lock = asyncio.Lock()
        self.reads = 0
        """Registry reads so far (for tests and the docs' cost figures)."""

    @property
    def specs(self) -> Mapping[str, AgentSpec]:
        """The snapshot as last read (no I/O)."""
        return self._specs

    @property
    def workers(self) -> tuple[WorkerInfo, ...]:
        """The live workers' profiles as last read (no I/O)."""
        return self._workers

    def invalidate(self) -> None:
        """Forget the snapshot: the next `resolve` reads the registry (`tenure route` shows it as it is now)."""
        self._read_at = None

    async def resolve(self, names: set[str]) -> None:
        """Make the snapshot fresh enough to answer for `names`: read again when it is older than `ttl_s`, or
        older than `miss_s` and missing one of them."""
        now = self._clock()
        age = None if self._read_at is None else now - self._read_at
        if age is not None and age < self._ttl_s and (names <= self._specs.keys() or age < self._miss_s):
            return
        async with self._lock:
            if self._read_at is not None and self._read_at > now:
                return  # another caller read it while this one waited
            rows = await self._store.registry_agents()
            specs: dict[str, AgentSpec] = {}
            for w in reversed(rows):  # oldest first: the most recently started worker's spec wins
                specs.update(specs_from_json(w.agent_specs, w.agents))
            self._specs = specs
            self._workers = tuple(rows)
            self.routed = {}
            self._read_at = self._clock()
            self.reads += 1
