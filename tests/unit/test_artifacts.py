"""The artifact store in a directory and the by-reference rule (docs/artifacts.md), on a real file system."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tenure.backends.artifacts import DirectoryArtifacts, open_artifacts
from tenure.backends.s3_artifacts import S3Artifacts, S3Location, parse_s3_url
from tenure.contracts.artifacts import parse_ref, stub_ref
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


def test_an_s3_url_names_a_bucket_a_prefix_and_options_and_never_credentials() -> None:
    assert parse_s3_url("s3://my-bucket") == S3Location("my-bucket", "")
    assert parse_s3_url("s3://my-bucket/tenure/artifacts/?region=eu-west-1") == S3Location(
        "my-bucket", "tenure/artifacts/", None, "eu-west-1"
    )
    where = parse_s3_url("s3://b.example/p?endpoint=https://s3.internal:9000&addressing=virtual")
    assert (where.endpoint, where.addressing, where.prefix) == ("https://s3.internal:9000", "virtual", "p/")
    bad = {
        "http://my-bucket/p": "not a 'http' URL",
        "s3://AKIDEXAMPLE:hunter2-secret@my-bucket/p": "credentials do not go in the URL",
        "s3://My_Bucket/p": "not a bucket name",
        "s3://my-bucket/a//b": "empty",
        "s3://my-bucket/a/../b": "'..'",
        "s3://my-bucket/p?endpont=http://h": "unknown option 'endpont'",
        "s3://my-bucket/p?endpoint=ftp://h": "endpoint must be http",
        "s3://my-bucket/p?endpoint=http://AKIDEXAMPLE:hunter2-secret@h": "without credentials",
        "s3://my-bucket/p?addressing=dns": "addressing is",
    }
    for url, message in bad.items():
        with pytest.raises(ConfigError, match=re.escape(message)) as caught:
            parse_s3_url(url)
        assert "hunter2" not in str(caught.value) and "AKIDEXAMPLE" not in str(caught.value)


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
    s3 = open_artifacts(None, "sqlite:///t.db", "s3://my-bucket/a/b/?endpoint=http://127.0.0.1:9000&region=eu-1")
    assert isinstance(s3, S3Artifacts) and s3.location == "s3://my-bucket/a/b/ at http://127.0.0.1:9000"
    with pytest.raises(ConfigError, match="not both"):
        open_artifacts("/srv/a", "sqlite:///t.db", "s3://my-bucket/a")
    with pytest.raises(ConfigError, match="not both"):
        Settings.from_env({"TENURE_ARTIFACTS_DIR": "/srv/a", "TENURE_ARTIFACTS_URL": "s3://my-bucket/a"})
    with pytest.raises(ConfigError, match="expected s3://"):
        Settings.from_env({"TENURE_ARTIFACTS_URL": "/srv/a"})
    assert Settings.from_env({"TENURE_ARTIFACTS_URL": "s3://b-1/p"}).store.artifacts_url == "s3://b-1/p"
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
