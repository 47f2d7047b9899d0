"""Results and evidence by reference (docs/artifacts.md): what a job row or an evidence record keeps of a JSON
text — the text itself, or the stub of an artifact written before the row that names it."""

from __future__ import annotations

import asyncio
from typing import Any

from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.errors import PermanentError
from tenure.contracts.text import dumps
from tenure.worker.config import WorkerConfig

INLINE_RESULT_BYTES = 1024 * 1024
"""The largest inline result when there is no artifact store (the limit before artifacts)."""
_PROBE_NODES = 200
_PROBE_BYTES = 64 * 1024


def probably_large(value: Any) -> bool:
    """Whether encoding `value` may take the event loop long enough to matter: a bounded look (at most
    `_PROBE_NODES` containers and strings) that says True once it saw 64 KiB of strings or ran out of budget.
    A large value is then encoded in a thread (a 20 MiB result takes a busy loop over a second)."""
    todo, seen, size = [value], 0, 0
    while todo:
        v = todo.pop()
        seen += 1
        if seen > _PROBE_NODES:
            return True
        if isinstance(v, str | bytes):
            size += len(v)
            if size > _PROBE_BYTES:
                return True
        elif isinstance(v, dict):
            todo.extend(v.values())
            size += sum(len(k) for k in v if isinstance(k, str))
        elif isinstance(v, list | tuple):
            todo.extend(v)
    return False


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
            f"(set TENURE_ARTIFACTS_DIR or TENURE_ARTIFACTS_URL; inline {what}s are limited to {INLINE_RESULT_BYTES} bytes)"
        )
    ref = await store.put(job_id, await asyncio.to_thread(text.encode, "utf-8"))
    return dumps(ref.stub())
