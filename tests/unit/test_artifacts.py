"""The artifact store in a directory and the by-reference rule (docs/artifacts.md), on a real file system."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tenure.backends.artifacts import DirectoryArtifacts, open_artifacts
from tenure.contracts.artifacts import CHUNK_BYTES, parse_ref, stub_ref
from tenure.contracts.errors import ConfigError, PermanentError
from tenure.contracts.text import dumps
from tenure.settings import Settings
from tenure.worker.byref import INLINE_RESULT_BYTES, by_reference, probably_large
from tenure.worker.config import WorkerConfig

JOB = "01a23185-e729-7186-bc11-810f7b871670"
OTHER = "01a23185-e729-7186-bc11-810f7b871671"


async def _read(store: DirectoryArtifacts, owner: str, digest: str) -> tuple[bytes, list[int]]:
    blob = await store.open(owner, digest)
    assert blob is not None
    chunks = [c async for c in blob.chunks]
    return b"".join(chunks), [len(c) for c in chunks]


async def test_a_put_is_atomic_content_addressed_per_owner_and_read_back_in_chunks(tmp_path: Path) -> None:
    store = DirectoryArtifacts(tmp_path / "a")
    data = os.urandom(3 * CHUNK_BYTES + 5)
    ref = await store.put(JOB, data)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data) and ref.owner == JOB
    assert ref.ref == f"{JOB}.{ref.sha256}" and parse_ref(ref.ref) == (JOB, ref.sha256)
    assert stub_ref(json.loads(dumps(ref.stub()))) == ref
    assert os.listdir(tmp_path / "a" / JOB) == [ref.sha256]  # no temporary file left behind
    body, sizes = await _read(store, JOB, ref.sha256)
    assert body == data and max(sizes) <= CHUNK_BYTES and len(sizes) == 4
    assert await store.put(JOB, data) == ref  # idempotent
    # the same bytes for another job are that job's own copy: deleting one owner leaves the other whole
    assert await store.put(OTHER, data) == type(ref)(OTHER, ref.sha256, ref.size)
    assert await store.delete_owners([JOB, "01a23185-0000-7000-8000-000000000000"]) == 1
    assert await store.open(JOB, ref.sha256) is None
    assert (await _read(store, OTHER, ref.sha256))[0] == data
    assert await store.open(OTHER, "0" * 64) is None and await store.open("../etc", ref.sha256) is None
    with pytest.raises(ValueError, match="job id"):
        await store.put("../escape", b"x")


def test_references_and_stubs_are_parsed_strictly() -> None:
    digest = "a" * 64
    assert parse_ref(f"{JOB}.{digest}") == (JOB, digest)
    for bad in ("", JOB, f"{JOB}.{'A' * 64}", f"../x.{digest}", f"{JOB}.{digest}0", f"a/b.{digest}"):
        assert parse_ref(bad) is None, bad
    assert stub_ref({"$artifact": f"{JOB}.{digest}", "size": 3, "sha256": digest}) is not None
    for bad_stub in ({"$artifact": 1, "size": 3}, {"$artifact": f"{JOB}.{digest}", "size": True}, {"size": 3}, "x"):
        assert stub_ref(bad_stub) is None


def test_the_default_directory_is_beside_the_sqlite_file_and_postgresql_needs_one(tmp_path: Path) -> None:
    store = open_artifacts(None, f"sqlite:///{tmp_path}/t.db")
    assert store is not None and store.location == f"{tmp_path}/t.db.artifacts"
    assert open_artifacts(None, "postgresql://h/db") is None
    shared = open_artifacts(str(tmp_path / "shared"), "postgresql://h/db")
    assert shared is not None and shared.location == str(tmp_path / "shared")
    with pytest.raises(ConfigError, match="directory path"):
        open_artifacts("s3://bucket/x", "postgresql://h/db")
    s = Settings.from_env(
        {"TENURE_ARTIFACTS_DIR": "/srv/a", "TENURE_ARTIFACT_THRESHOLD_BYTES": "1000", "TENURE_MAX_RESULT_BYTES": "5000"}
    )
    assert (s.store.artifacts_dir, s.worker.artifact_threshold_bytes, s.worker.max_result_bytes) == ("/srv/a", 1000, 5000)
    assert (WorkerConfig().artifact_threshold_bytes, WorkerConfig().max_result_bytes) == (256 * 1024, 1024**3)


async def test_by_reference_over_the_threshold_inline_under_it_and_refused_over_the_limits(tmp_path: Path) -> None:
    cfg = WorkerConfig(artifact_threshold_bytes=100, max_result_bytes=10_000)
    store = DirectoryArtifacts(tmp_path)
    small = dumps({"x": "y" * 50})
    assert await by_reference(cfg, store, JOB, small, False, "result") == small
    big = dumps({"x": "é" * 60})  # 60 characters, 120 bytes of UTF-8: the threshold counts bytes
    stub = json.loads(await by_reference(cfg, store, JOB, big, False, "result"))
    assert stub["size"] == len(big.encode()) and (await _read(store, JOB, stub["sha256"]))[0] == big.encode()
    # a small value that would read as a stub goes to the store too: every stub in a row is the worker's
    fake = dumps({"$artifact": f"{OTHER}.{'0' * 64}", "size": 1})
    assert len(fake) < 1000
    real = json.loads(await by_reference(WorkerConfig(artifact_threshold_bytes=1000), store, JOB, fake, True, "result"))
    assert real["$artifact"].startswith(JOB + ".") and (await _read(store, JOB, real["sha256"]))[0] == fake.encode()
    with pytest.raises(PermanentError, match="the limit is 10000"):
        await by_reference(cfg, store, JOB, "x" * 10_001, False, "result")
    # without a store: inline up to the old 1 MiB, then a clear error naming the setting
    cfg = WorkerConfig(artifact_threshold_bytes=100)
    assert await by_reference(cfg, None, JOB, big, False, "result") == big
    with pytest.raises(PermanentError, match="TENURE_ARTIFACTS_DIR"):
        await by_reference(cfg, None, JOB, "x" * (INLINE_RESULT_BYTES + 1), False, "result")


def test_a_large_result_is_recognised_by_a_bounded_look_and_encoded_off_the_loop() -> None:
    assert not probably_large({"answer": 42, "text": "x" * 1000, "items": list(range(50))})
    assert probably_large({"data": "x" * (64 * 1024 + 1)})
    assert probably_large([{"a": "y" * 1000} for _ in range(100)])  # many small strings
    assert probably_large(list(range(10_000)))  # many nodes
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    assert probably_large(cyclic)  # the budget ends the look; the encoding then fails in its thread
