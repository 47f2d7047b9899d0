"""Coordinators on SQLite (docs/coordinators.md): a parent's children, read by `parent_job_id`. A mixin of
`SqliteStore`."""

from __future__ import annotations

from tenure.backends.sqlite._connection import Q, SqliteConnection
from tenure.contracts.children import ChildJob
from tenure.contracts.states import JobState


class ChildReads:
    """The children reads of `SqliteStore`."""

    connection: SqliteConnection

    async def children(self, job_id: str) -> list[ChildJob]:
        conn = self.connection
        rows = await conn.run(lambda: conn.read(lambda db: db.execute(Q["job_children"], (job_id,)).fetchall()), "children")
        return [ChildJob(r["id"], r["agent"], JobState(r["state"])) for r in rows]
