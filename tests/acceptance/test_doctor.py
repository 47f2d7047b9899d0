"""`tenure doctor` as an operator runs it: against a real store, with and without trouble."""

from __future__ import annotations

import asyncio
import json
import os

from tenure.local import connect
from tests.conftest import PYTHON, REDIS_URL, ROOT
from tests.s3server import CREDENTIALS, REGION, S3Bucket, free_port

FAST = {"TENURE_HEARTBEAT_S": "0.1", "TENURE_CLAIM_TTL_S": "0.4", "TENURE_SWEEP_INTERVAL_S": "0.05"}


async def doctor(database_url: str, **env: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    full = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    full.update(FAST, TENURE_DATABASE_URL=database_url, **env)
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "tenure.cli",
        "doctor",
        "--json",
        env=full,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out or b"{}") if out else {"stderr": err.decode()}


def checks(report: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["name"]: c for c in report["checks"]}


async def test_doctor_reports_a_healthy_store_and_redis_and_exits_zero(database_url: str) -> None:
    async with connect("tenure.demos.examples:app", database_url):
        pass  # migrated
    code, report = await doctor(database_url, TENURE_REDIS_URL=REDIS_URL)
    c = checks(report)
    assert code == 0 and report["ok"], report
    assert c["schema"]["data"]["level"] == c["schema"]["data"]["expected"] >= 1
    assert abs(c["clock"]["data"]["skew_s"]) < 1.0
    assert c["redis"]["status"] == "ok" and c["redis"]["data"]["version"]
    assert c["workers"]["status"] == "warn"  # nobody running, nothing queued: worth saying, not failing
    # the artifact store: the SQLite file's directory takes a probe; PostgreSQL without one has none
    assert c["artifacts"]["status"] == "ok", c["artifacts"]
    assert ("written, read back and deleted" if database_url.startswith("sqlite") else "none configured") in c["artifacts"][
        "detail"
    ]


async def test_doctor_probes_an_s3_artifact_store_and_fails_on_one_it_cannot_reach(
    sqlite_database_url: str, s3_bucket: S3Bucket
) -> None:
    async with connect("tenure.demos.examples:app", sqlite_database_url):
        pass  # migrated
    code, report = await doctor(sqlite_database_url, TENURE_ARTIFACTS_URL=s3_bucket.url, **CREDENTIALS)
    c = checks(report)
    assert code == 0 and c["artifacts"]["status"] == "ok", c["artifacts"]
    assert c["artifacts"]["detail"].startswith(f"s3://{s3_bucket.name}/{s3_bucket.prefix}/ at ")
    assert await asyncio.to_thread(s3_bucket.keys) == []  # the probe deleted
    unreachable = f"s3://{s3_bucket.name}/p?endpoint=http://127.0.0.1:{free_port()}&region={REGION}"
    code, report = await doctor(sqlite_database_url, TENURE_ARTIFACTS_URL=unreachable, **CREDENTIALS)
    c = checks(report)
    assert code == 1 and c["artifacts"]["status"] == "fail" and c["artifacts"]["data"]["step"] == "write"
    assert "cannot write a probe artifact" in c["artifacts"]["detail"]
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in json.dumps(report)


async def test_doctor_fails_on_a_job_stuck_past_its_claim_ttl_and_on_an_unreachable_redis(
    database_url: str,
) -> None:
    async with connect("tenure.demos.examples:app", database_url) as client:
        job_id = (await client.submit("echo", {})).job.id
        claims = await client.store.claim("ghost-worker", ["echo"], [], 1, 0.1)  # claimed, never swept
        assert [c.fence.job_id for c in claims] == [job_id]
        await asyncio.sleep(0.6)  # past the TTL plus doctor's grace (3 sweeps + a heartbeat)
    code, report = await doctor(database_url, TENURE_REDIS_URL="redis://127.0.0.1:1/0")
    c = checks(report)
    assert code == 1 and not report["ok"]
    assert c["stuck_jobs"]["status"] == "fail"
    assert [j["job_id"] for j in c["stuck_jobs"]["data"]["jobs"]] == [job_id]
    assert c["workers"]["status"] == "fail"  # a job is queued and no worker is alive
    assert c["redis"]["status"] == "fail"
