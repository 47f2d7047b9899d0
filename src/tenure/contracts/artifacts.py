"""Results and evidence by reference (docs/artifacts.md): the artifact store's protocol and the reference format.

A result (or an evidence record) whose JSON text is over the threshold is written to an `ArtifactStore` by the
worker before the finish; the job row then holds a small stub in its place:

    {"$artifact": "<job id>.<sha256 hex>", "size": <bytes>, "sha256": "<sha256 hex>"}

Artifacts are keyed by their owner (the job) and their content's SHA-256: two jobs with the same bytes each
have their own copy, so deleting one job's artifacts (the retention's collector) never touches another's.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

ARTIFACT_KEY = "$artifact"
CHUNK_BYTES = 64 * 1024
"""What a reader yields at a time: a stream never holds a whole artifact in memory."""

_OWNER = re.compile(r"[0-9A-Za-z_-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """One stored artifact: its owner (a job id), its content's SHA-256 (hex) and its size in bytes."""

    owner: str
    sha256: str
    size: int

    @property
    def ref(self) -> str:
        """The reference as the API shows it: `<owner>.<sha256>`."""
        return f"{self.owner}.{self.sha256}"

    def stub(self) -> dict[str, Any]:
        """What the job row (or the evidence record) holds in the artifact's place."""
        return {ARTIFACT_KEY: self.ref, "size": self.size, "sha256": self.sha256}


def valid_owner(owner: str) -> bool:
    """An owner names a directory: letters, digits, `-` and `_` only (a job id), never a path."""
    return _OWNER.fullmatch(owner) is not None


def parse_ref(text: str) -> tuple[str, str] | None:
    """`<owner>.<sha256>` → (owner, sha256), or None when `text` is not a reference."""
    owner, sep, digest = text.partition(".")
    if not sep or not valid_owner(owner) or _SHA256.fullmatch(digest) is None:
        return None
    return owner, digest


def looks_like_stub(value: Any) -> bool:
    """Whether a value would read as an artifact stub (a dict with the `$artifact` key). The worker stores any
    such result as an artifact whatever its size, so every stub in a job row is one the worker wrote."""
    return isinstance(value, dict) and ARTIFACT_KEY in value


def stub_ref(value: Any) -> ArtifactRef | None:
    """The artifact a stub names, or None when `value` is not a well-formed stub."""
    if not looks_like_stub(value):
        return None
    parsed = parse_ref(value[ARTIFACT_KEY]) if isinstance(value[ARTIFACT_KEY], str) else None
    size = value.get("size")
    if parsed is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return ArtifactRef(parsed[0], parsed[1], size)


@dataclass(slots=True)
class Blob:
    """An artifact opened for reading: its size, its digest and its bytes in chunks of at most `CHUNK_BYTES`.
    Iterate `chunks` once; the file (or connection) behind it is released when the iteration ends or `close`."""

    size: int
    sha256: str
    chunks: AsyncIterator[bytes]
    release: Callable[[], None] | None = None

    async def close(self) -> None:
        """Stop reading: release the file (or connection), also when `chunks` was never iterated."""
        aclose = getattr(self.chunks, "aclose", None)
        if aclose is not None:
            await aclose()
        if self.release is not None:
            self.release()


class ArtifactStore(Protocol):
    """Where artifacts live (backends/artifacts.py: a directory). Writes are atomic: a reader sees a whole
    artifact or none."""

    @property
    def location(self) -> str:
        """Where the artifacts are (a directory path or a URL), for logs and docs."""
        ...

    async def put(self, owner: str, data: bytes) -> ArtifactRef:
        """Store `data` for `owner` (a job id), durably, and return its reference. Idempotent: the same bytes
        for the same owner are one artifact."""
        ...

    async def open(self, owner: str, sha256: str) -> Blob | None:
        """The artifact `sha256` of `owner` opened for streaming, or None when there is none."""
        ...

    async def delete_owners(self, owners: Sequence[str]) -> int:
        """Delete every artifact of these owners (jobs whose history was purged); how many were deleted."""
        ...

    async def close(self) -> None:
        """Release what this instance holds. Idempotent."""
        ...


__all__ = [
    "ARTIFACT_KEY",
    "CHUNK_BYTES",
    "ArtifactRef",
    "ArtifactStore",
    "Blob",
    "looks_like_stub",
    "parse_ref",
    "stub_ref",
    "valid_owner",
]
