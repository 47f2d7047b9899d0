"""The S3-compatible artifact store against a real server process over HTTP (moto's emulator, tests/s3server.py):
what the shared contract (tests/contract/test_artifact_stores.py) cannot say about an object store — deletes in
batches of at most 1,000 keys, and every failure of the bucket (unreachable, access denied, no such bucket)
translated into `ArtifactsUnavailable`, which the gateway answers as a 503 problem, never a stack trace."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tenure.app import load_app, open_backends
from tenure.backends.s3_artifacts import S3Artifacts, parse_s3_url
from tenure.contracts.errors import ArtifactsUnavailable, StoreUnavailable
from tenure.contracts.states import JobState
from tenure.contracts.text import dumps
from tenure.gateway.app import Gateway
from tenure.gateway.auth import Auth
from tenure.serve import gateway_config
from tenure.settings import Settings
from tenure.worker.byref import by_reference
from tenure.worker.config import WorkerConfig
from tenure.worker.outcomes import outcome_of
from tests.s3server import CREDENTIALS, REGION, S3Bucket, S3Server, free_port

JOB = "01a23185-e729-7186-bc11-810f7b871670"


def _delete_requests(server: S3Server, bucket: str) -> int:
    """How many DeleteObjects requests the server has logged for `bucket` (its access log: one line a request)."""
    return len(re.findall(rf'"POST /{bucket}\?delete', server.log_path.read_text(errors="replace")))


async def test_delete_owners_lists_each_owner_and_deletes_in_batches_of_at_most_1000(s3_bucket: S3Bucket) -> None:
    store = S3Artifacts(parse_s3_url(s3_bucket.url))
    try:
        owners = [f"{JOB[:-1]}{i}" for i in range(3)]
        # 999 objects of the first owner (seeded straight into the bucket: 999 puts through the store would only
        # test `put` again), one of each other owner: 1,001 keys, one more than a DeleteObjects request takes
        client = s3_bucket.server.client()

        def seed(i: int) -> None:
            client.put_object(Bucket=s3_bucket.name, Key=f"{s3_bucket.prefix}/{owners[0]}/{i:064x}", Body=b"x")

        with ThreadPoolExecutor(8) as pool:
            await asyncio.get_running_loop().run_in_executor(None, lambda: list(pool.map(seed, range(999))))
        for owner in owners[1:]:
            await store.put(owner, owner.encode())
        kept = await store.put(JOB[:-1] + "9", b"kept")
        before = _delete_requests(s3_bucket.server, s3_bucket.name)
        assert await store.delete_owners(owners) == 1001
        assert _delete_requests(s3_bucket.server, s3_bucket.name) - before == 2  # 1,000 keys, then 1: owners share batches
        assert await asyncio.to_thread(s3_bucket.keys) == [f"{s3_bucket.prefix}/{kept.owner}/{kept.sha256}"]
    finally:
        await store.close()


async def test_an_unreachable_endpoint_or_a_missing_bucket_is_artifacts_unavailable(s3_bucket: S3Bucket) -> None:
    dead = S3Artifacts(parse_s3_url(f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}&region={REGION}"))
    missing = S3Artifacts(parse_s3_url(f"s3://no-such-bucket-{s3_bucket.name}/p?endpoint={s3_bucket.server.endpoint}"))
    try:
        for store in (dead, missing):
            for call in (store.put(JOB, b"{}"), store.open(JOB, "0" * 64), store.delete_owners([JOB])):
                with pytest.raises(ArtifactsUnavailable, match=re.escape(store.location)) as caught:
                    await call
                assert isinstance(caught.value, StoreUnavailable) and caught.value.__cause__ is not None
        with pytest.raises(ArtifactsUnavailable, match="NoSuchBucket"):
            await missing.put(JOB, b"{}")
    finally:
        await dead.close()
        await missing.close()


async def test_a_result_the_bucket_cannot_take_is_a_retryable_failure_of_its_execution() -> None:
    dead = S3Artifacts(parse_s3_url(f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}&region={REGION}"))
    try:
        with pytest.raises(ArtifactsUnavailable) as caught:
            await by_reference(WorkerConfig(artifact_threshold_bytes=10), dead, JOB, dumps("x" * 100), False, "result")
    finally:
        await dead.close()
    outcome = outcome_of(caught.value)  # what the execution's finish writes: another attempt, while any remain
    assert outcome is not None and (outcome.state, outcome.code) == (JobState.SCHEDULED, "artifacts_unavailable")


async def test_credentials_the_server_refuses_are_artifacts_unavailable_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server of this test's own that checks every request's credentials (moto: no request is let through).
    strict = await asyncio.to_thread(S3Server.start, tmp_path, {"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        for name, value in CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        store = S3Artifacts(parse_s3_url(f"s3://bucket/p?endpoint={strict.endpoint}&region={REGION}"))
        try:
            for call in (store.put(JOB, b"{}"), store.open(JOB, "0" * 64), store.delete_owners([JOB])):
                with pytest.raises(ArtifactsUnavailable) as caught:
                    await call
                text = str(caught.value)
                assert re.search(r"InvalidAccessKeyId|AccessDenied|403", text), text
                assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in text and CREDENTIALS["AWS_ACCESS_KEY_ID"] not in text
        finally:
            await store.close()
    finally:
        strict.stop()


async def test_the_gateway_answers_503_when_the_artifact_store_does_not_answer(
    sqlite_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}&region={REGION}"
    settings = Settings.of(database_url=sqlite_database_url, artifacts_url=url)
    backends = await open_backends(settings)
    try:
        gateway = Gateway(backends, load_app("tenure.demos.examples:app").specs(), Auth.open(), gateway_config(settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gateway.asgi), base_url="http://gateway") as http:
            job = (await http.post("/v1/jobs", json={"agent": "echo", "input": 0})).json()
            r = await http.get(f"/v1/artifacts/{job['id']}.{'0' * 64}")
            assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json", r.text
            assert r.json()["title"] == "Artifact store unavailable" and r.headers["retry-after"] == "1"
            assert "127.0.0.1" not in r.text  # where the bucket is goes to the gateway's log
            logged = [rec.getMessage() for rec in caplog.records if rec.name == "tenure.gateway"]
            assert any("the artifact store s3://bucket/p/ at http://127.0.0.1:" in m for m in logged), logged
    finally:
        await backends.close()
