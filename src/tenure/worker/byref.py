"""Results and evidence by reference (docs/artifacts.md): what a job row or an evidence record keeps of a JSON
text — the text itself, or the stub of an artifact written before the row that names it."""

from __future__ import annotations

from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.errors import PermanentError
from tenure.contracts.text import dumps
from tenure.worker.config import WorkerConfig

INLINE_RESULT_BYTES = 1024 * 1024
"""The largest inline result when there is no artifact store (the limit before artifacts)."""


async def by_reference(
    cfg: WorkerConfig, store: ArtifactStore | None, job_id: str, text: str, force: bool, what: str
) -> str:
    """`text` (JSON) as the row keeps it: itself, or — over the threshold, or when it would read as a stub
    (`force`) — the stub of an artifact written (durably) first. Raises `PermanentError` over the limits."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > cfg.max_result_bytes:
        raise PermanentError(f"{what} is {size} bytes; the limit is {cfg.max_result_bytes} (TENURE_MAX_RESULT_BYTES)")
    if size <= cfg.artifact_threshold_bytes and not force:
        return text
    if store is None:
        if size <= INLINE_RESULT_BYTES:
            return text  # (a stub-like result stays inline too: without a store nothing reads stubs)
        raise PermanentError(
            f"{what} is {size} bytes, over the artifact threshold, and this worker has no artifact store "
            f"(set TENURE_ARTIFACTS_DIR; inline {what}s are limited to {INLINE_RESULT_BYTES} bytes)"
        )
    ref = await store.put(job_id, text.encode("utf-8"))
    return dumps(ref.stub())
