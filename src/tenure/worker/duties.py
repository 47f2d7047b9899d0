"""Duties: work every worker can do but only one does at a time, and the loops that keep the others running.

sweeper  only while holding the `duty:sweeper` lease (model: River's `internal/maintenance/job_rescuer`):
         release expired pre-start claims, mark lost (or requeue retry-safe) running jobs whose owner
         stopped heartbeating, expire queued jobs past their deadline, move due retries to the queue, mark
         silent workers gone; delete one batch of jobs finished over TENURE_RETENTION_DAYS ago (or their
         tenant's TENURE_TENANT_RETENTION_DAYS) with their history (docs/retention.md); hint what became
         claimable to the ready index; and, as the one process that does it, export the registry, the live job
         counts and the store's health (`tenure_workers`, `tenure_jobs`, `tenure_store_*`: docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.ready import ReadyIndex
from tenure.contracts.store import Leases, Store
from tenure.worker.claiming import hint_ready
from tenure.worker.config import WorkerConfig
from tenure.worker.observe import WorkerObserver

log = logging.getLogger("tenure.worker")

SWEEPER_DUTY = "duty:sweeper"
_REGISTRY_EXPORT_S = 5.0


class SweeperDuty:
    """The sweeper, run by whichever worker holds the `duty:sweeper` lease."""

    def __init__(self, store: Store, duty: Leases | None, worker_id: str, config: WorkerConfig,
                 observer: WorkerObserver, ready_index: ReadyIndex | None,
                 artifacts: ArtifactStore | None = None) -> None:  # fmt: skip
        self._store = store
        self._duty = duty
        self._worker_id = worker_id
        self._config = config
        self._obs = observer
        self._index = ready_index
        self._artifacts = artifacts
        self._exported_at = 0.0
        self._holding = False

    async def run(self) -> None:
        cfg = self._config
        while True:
            try:
                holding = self._duty is not None and await self._duty.acquire(
                    SWEEPER_DUTY, self._worker_id, 1, cfg.claim_ttl_s
                )
                if self._holding and not holding:
                    self._obs.health_forgotten()  # the new holder says it now; max() across processes is theirs
                self._holding = holding
                if holding:
                    await self.sweep_once()
            except StoreUnavailable as exc:
                log.warning("sweep failed: %s", exc)
            await asyncio.sleep(cfg.sweep_interval_s)

    async def sweep_once(self) -> None:
        report = await self._store.sweep(self._config.worker_ttl_s)
        # Retention (docs/retention.md): one bounded batch per sweep; a pass with nothing old writes nothing.
        # Tenants of TENURE_TENANT_RETENTION_DAYS keep theirs; the batch bounds all tenants' deletions together.
        default_s, by_tenant = self._config.retention_s()
        purged = await self._store.purge_finished(default_s, self._config.retention_batch, by_tenant)
        if purged:
            log.info("retention: deleted %d jobs finished longer ago than their tenant's retention", len(purged))
            if self._artifacts is not None:
                # The jobs' rows are gone (committed): their artifacts go with them (docs/artifacts.md). A failure
                # here leaves files no row names; they are not retried (the job ids are gone with the rows).
                try:
                    files = await self._artifacts.delete_owners(purged)
                except (OSError, StoreUnavailable) as exc:  # a file system, or an object store (ArtifactsUnavailable)
                    log.warning("retention: deleting the artifacts of %d jobs failed: %s", len(purged), exc)
                else:
                    if files:
                        log.info("retention: deleted %d artifacts of %d jobs", files, len(purged))
        await hint_ready(self._index, self._store, report.released + report.requeued + report.due)
        if report.total():
            log.info("sweep: %s", {k: len(v) for k, v in report.as_dict().items() if v})
        self._obs.swept(report)
        now = time.monotonic()
        if now - self._exported_at >= _REGISTRY_EXPORT_S:
            self._exported_at = now
            self._obs.registry_seen(await self._store.list_workers(include_gone=False))
            self._obs.jobs_seen(await self._store.count_live_jobs())
            self._obs.health_seen(await self._store.health())

    async def leave(self) -> None:
        """Give the duty up at shutdown, so another worker takes it at once rather than after its TTL."""
        if self._duty is not None:
            with contextlib.suppress(StoreUnavailable):
                await self._duty.release(SWEEPER_DUTY, self._worker_id)


async def keep_running(name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run one of a worker's background loops. A loop that raises — a defect, or a driver error a backend failed
    to translate — is logged and started again after a growing delay: no background loop ends but with its
    worker (and a failing one must not take the worker's task group, and every job on it, down)."""
    delay = 0.1
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the %s loop failed; starting it again in %.1f s", name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
