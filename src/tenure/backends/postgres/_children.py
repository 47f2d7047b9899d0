"""Coordinators on PostgreSQL (docs/coordinators.md): a parent's children, read by `parent_job_id`. A mixin of
`PostgresStore`."""

from __future__ import annotations

from tenure.backends._queries import load_queries
from tenure.backends.postgres._connections import StoreConnections
from tenure.contracts.children import ChildJob
from tenure.contracts.states import JobState
from tenure.contracts.types import is_uuid

Q = load_queries("tenure.backends.postgres")


class ChildReads:
    """The children reads of `PostgresStore`."""

    _db: StoreConnections

    async def children(self, job_id: str) -> list[ChildJob]:
        if not is_uuid(job_id):
            return []
        async with self._db.pooled("job_children") as conn:
            rows = await conn.fetch(Q["job_children"], job_id)
        return [ChildJob(r["id"], r["agent"], JobState(r["state"])) for r in rows]
