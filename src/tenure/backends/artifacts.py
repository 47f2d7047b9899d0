"""The artifact store in a directory (docs/artifacts.md): `<root>/<owner>/<sha256>`, one directory per job.

A write goes to a temporary file in the owner's directory, is fsynced, renamed over its final name and the
directory fsynced: a reader (another process, another host on a shared file system) sees the whole artifact or
nothing, and a crash mid-write leaves only a `.tmp-*` file, which goes with its owner's directory. Reads are
chunked (`CHUNK_BYTES`) through threads: the event loop never blocks on the disk and a stream never holds a
whole artifact. All file work runs in `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO

from tenure.contracts.artifacts import CHUNK_BYTES, ArtifactRef, ArtifactStore, Blob, valid_owner
from tenure.contracts.errors import ConfigError


class DirectoryArtifacts:
    """Artifacts as files under `root` (created on first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)  # relative: to the working directory, like a relative SQLite path

    @property
    def location(self) -> str:
        return self.root

    def _dir(self, owner: str) -> str:
        if not valid_owner(owner):
            raise ValueError(f"an artifact owner is a job id, not {owner!r}")
        return os.path.join(self.root, owner)

    # -- write -------------------------------------------------------------------------------------------------------
    async def put(self, owner: str, data: bytes) -> ArtifactRef:
        return await asyncio.to_thread(self._put, owner, data)

    def _put(self, owner: str, data: bytes) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        ref = ArtifactRef(owner, digest, len(data))
        folder = self._dir(owner)
        final = os.path.join(folder, digest)
        with contextlib.suppress(OSError):
            if os.stat(final).st_size == len(data):
                return ref  # already there: the name is the content's digest
        new_dir = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(folder)
        if new_dir:
            _fsync_dir(self.root)
        return ref

    # -- read --------------------------------------------------------------------------------------------------------
    async def open(self, owner: str, sha256: str) -> Blob | None:
        if not valid_owner(owner) or len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            return None
        opened = await asyncio.to_thread(_open, os.path.join(self._dir(owner), sha256))
        if opened is None:
            return None
        f, size = opened
        return Blob(size, sha256, _chunks(f), f.close)

    # -- collect -----------------------------------------------------------------------------------------------------
    async def delete_owners(self, owners: Sequence[str]) -> int:
        return await asyncio.to_thread(self._delete_owners, list(owners))

    def _delete_owners(self, owners: list[str]) -> int:
        deleted = 0
        for owner in owners:
            folder = self._dir(owner)
            try:
                deleted += sum(1 for name in os.listdir(folder) if not name.startswith(".tmp-"))
            except FileNotFoundError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
        return deleted

    async def close(self) -> None:
        return None


def _open(path: str) -> tuple[BinaryIO, int] | None:
    try:
        f = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return f, os.fstat(f.fileno()).st_size
    except BaseException:
        f.close()
        raise


async def _chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while True:
            chunk = await asyncio.to_thread(f.read, CHUNK_BYTES)
            if not chunk:
                return
            yield chunk
    finally:
        f.close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_artifacts(directory: str | None, database_url: str, url: str | None = None) -> ArtifactStore | None:
    """The deployment's artifact store: the S3-compatible bucket of `url` (TENURE_ARTIFACTS_URL) when set; else
    `directory` (TENURE_ARTIFACTS_DIR) when set; else, for a SQLite file, `<database file>.artifacts` beside it;
    else (PostgreSQL without either) none. Setting both is a `ConfigError`."""
    if url:
        if directory:
            raise ConfigError("set TENURE_ARTIFACTS_DIR or TENURE_ARTIFACTS_URL, not both")
        from tenure.backends.s3_artifacts import S3Artifacts, parse_s3_url

        return S3Artifacts(parse_s3_url(url))
    if directory:
        if "://" in directory:
            raise ConfigError(
                f"TENURE_ARTIFACTS_DIR {directory!r}: a directory path (an object-store URL goes in TENURE_ARTIFACTS_URL)"
            )
        return DirectoryArtifacts(directory)
    if database_url.startswith("sqlite:///"):
        path = database_url[len("sqlite:///") :].partition("?")[0]
        if path and path != ":memory:":
            return DirectoryArtifacts(path + ".artifacts")
    return None


__all__ = ["DirectoryArtifacts", "open_artifacts"]
