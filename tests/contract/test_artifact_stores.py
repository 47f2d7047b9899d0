"""The `ArtifactStore` contract (docs/artifacts.md), on every store: a directory on the real file system, and an
S3-compatible bucket on a real server process over HTTP (moto's emulator: tests/s3server.py). Both keep the same
`<owner>/<sha256>` layout, which each case reads back its own way."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tenure.backends.artifacts import DirectoryArtifacts, open_artifacts
from tenure.backends.s3_artifacts import S3Artifacts
from tenure.contracts.artifacts import CHUNK_BYTES, ArtifactStore, parse_ref, stub_ref
from tenure.contracts.text import dumps
from tests.s3server import S3Bucket

JOB = "01a23185-e729-7186-bc11-810f7b871670"
OTHER = "01a23185-e729-7186-bc11-810f7b871671"
ABSENT = "01a23185-0000-7000-8000-000000000000"


@dataclass
class Case:
    """One store under test, and how to list what it holds (`<owner>/<name>`, as the store lays it out)."""

    store: ArtifactStore
    stored: Callable[[], list[str]]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture(params=["directory", "s3"])
async def case(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Case]:
    if request.param == "directory":
        root = tmp_path / "artifacts"
        store: ArtifactStore = DirectoryArtifacts(root)
        stored = lambda: _files(root)  # noqa: E731
    else:
        bucket: S3Bucket = request.getfixturevalue("s3_bucket")
        store = open_artifacts(None, "postgresql://h/db", bucket.url)  # type: ignore[assignment]
        assert isinstance(store, S3Artifacts)
        stored = lambda: [k.removeprefix(bucket.prefix + "/") for k in bucket.keys()]  # noqa: E731
    try:
        yield Case(store, stored)
    finally:
        await store.close()


async def _read(store: ArtifactStore, owner: str, digest: str) -> tuple[bytes, list[int]]:
    blob = await store.open(owner, digest)
    assert blob is not None
    chunks = [c async for c in blob.chunks]
    await blob.close()
    return b"".join(chunks), [len(c) for c in chunks]


async def test_a_put_is_content_addressed_per_owner_and_read_back_in_chunks(case: Case) -> None:
    store = case.store
    data = os.urandom(3 * CHUNK_BYTES + 5)
    ref = await store.put(JOB, data)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data) and ref.owner == JOB
    assert ref.ref == f"{JOB}.{ref.sha256}" and parse_ref(ref.ref) == (JOB, ref.sha256)
    assert stub_ref(json.loads(dumps(ref.stub()))) == ref
    stored = await asyncio.to_thread(case.stored)
    assert stored == [f"{JOB}/{ref.sha256}"]  # the layout; no temporary object left behind
    blob = await store.open(JOB, ref.sha256)
    assert blob is not None and (blob.size, blob.sha256) == (len(data), ref.sha256)
    await blob.close()  # released without being read
    body, sizes = await _read(store, JOB, ref.sha256)
    assert body == data and max(sizes) <= CHUNK_BYTES and len(sizes) == 4
    assert await store.put(JOB, data) == ref  # idempotent: still one artifact
    assert await asyncio.to_thread(case.stored) == stored
    # the same bytes for another job are that job's own copy: deleting one owner leaves the other whole
    assert await store.put(OTHER, data) == type(ref)(OTHER, ref.sha256, ref.size)
    small = await store.put(JOB, b'"small"')
    assert await store.delete_owners([JOB, ABSENT]) == 2
    assert await store.open(JOB, ref.sha256) is None and await store.open(JOB, small.sha256) is None
    assert (await _read(store, OTHER, ref.sha256))[0] == data
    assert await asyncio.to_thread(case.stored) == [f"{OTHER}/{ref.sha256}"]
    assert await store.delete_owners([]) == 0


async def test_a_missing_or_malformed_artifact_opens_as_none_and_an_owner_is_never_a_path(case: Case) -> None:
    store = case.store
    assert await store.open(JOB, "0" * 64) is None  # nothing stored yet, for this owner or any
    ref = await store.put(JOB, b"{}")
    assert await store.open(OTHER, ref.sha256) is None  # another owner's digest
    assert await store.open("../etc", ref.sha256) is None and await store.open(JOB, "../" + ref.sha256[3:]) is None
    assert await store.open(JOB, ref.sha256.upper()) is None
    with pytest.raises(ValueError, match="job id"):
        await store.put("../escape", b"x")
    with pytest.raises(ValueError, match="job id"):
        await store.delete_owners(["a/b"])
    assert await store.put(JOB, b"") == type(ref)(JOB, hashlib.sha256(b"").hexdigest(), 0)  # empty is an artifact
    assert (await _read(store, JOB, hashlib.sha256(b"").hexdigest()))[0] == b""
