"""Results and evidence by reference (docs/artifacts.md), with real processes on SQLite and PostgreSQL: a `tenure
worker` returns a 20 MiB result and a `tenure gateway` streams it. The job row keeps a stub of a few hundred
bytes; the download equals the bytes (digest); the gateway's peak RSS does not grow by anything near the
result's size while it streams (VmHWM, reset just before: /proc/<pid>/clear_refs); another tenant's key gets
404 on both endpoints; and the retention deletes the artifact files with their job. Each on both artifact
stores: the directory, and an S3-compatible bucket on a real server process (moto's emulator, tests/s3server.py)
named by TENURE_ARTIFACTS_URL."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import asyncpg
import httpx
import pytest

from tenure.client import Client
from tenure.contracts.text import dumps
from tenure.local import connect
from tenure.settings import Settings
from tests.acceptance.test_cli import tenure
from tests.acceptance.up import free_port
from tests.apps.artifacts_app import payload
from tests.conftest import PG_BASE
from tests.integration.procs import TenureProc, WorkerProc, eventually
from tests.s3server import CREDENTIALS, S3Bucket

APP = "tests.apps.artifacts_app:app"
MiB = 1024 * 1024
SIZE = 20 * MiB
KEYS = {"tenant-a": "key-a-0123456789", "tenant-b": "key-b-0123456789"}


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_peak(pid: int) -> None:
    """Make VmHWM the current RSS (Linux ≥ 4.0): the peak measured afterwards is the download's."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    assert _status_bytes(pid, "VmHWM") - _status_bytes(pid, "VmRSS") < MiB


@dataclass
class Artifacts:
    """The artifact store of one run: the settings that name it, and what it holds, read its own way."""

    env: dict[str, str] = field(default_factory=dict)
    size: Callable[[str, str], int | None] = lambda owner, digest: None
    owned: Callable[[str], bool] = lambda owner: False


def _directory(root: Path, env: dict[str, str]) -> Artifacts:
    def size(owner: str, digest: str) -> int | None:
        path = root / owner / digest
        return path.stat().st_size if path.exists() else None

    return Artifacts(env, size, lambda owner: (root / owner).exists())


@pytest.fixture(params=["directory", "s3"])
def artifacts(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Artifacts:
    if request.param == "s3":
        bucket: S3Bucket = request.getfixturevalue("s3_bucket")
        return Artifacts(
            {"TENURE_ARTIFACTS_URL": bucket.url, **CREDENTIALS},
            bucket.size,
            lambda owner: any(k.startswith(f"{bucket.prefix}/{owner}/") for k in bucket.keys()),
        )
    if database_url.startswith("sqlite"):  # the default: beside the file
        return _directory(Path(database_url.removeprefix("sqlite:///") + ".artifacts"), {})
    shared = tmp_path / "shared-artifacts"  # PostgreSQL: a directory the workers and gateways share
    return _directory(shared, {"TENURE_ARTIFACTS_DIR": str(shared)})


async def _stored_result_length(database_url: str, job_id: str) -> int:
    """The length of the job row's result column, read with SQL."""
    if database_url.startswith("sqlite"):

        def read() -> int:
            db = sqlite3.connect(database_url.removeprefix("sqlite:///"))
            try:
                return int(db.execute("SELECT length(result) FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])
            finally:
                db.close()

        return await asyncio.to_thread(read)
    schema = parse_qs(urlparse(database_url).query)["search_path"][0]
    conn = await asyncpg.connect(PG_BASE, server_settings={"search_path": schema})
    try:
        return int(await conn.fetchval("SELECT length(result::text) FROM jobs WHERE id = $1::uuid", job_id))
    finally:
        await conn.close()


async def _download(client: httpx.AsyncClient, path: str) -> tuple[int, str, httpx.Headers]:
    """Stream `path`: how many bytes, their SHA-256, the response's headers (never the whole body in memory)."""
    digest, size = hashlib.sha256(), 0
    async with client.stream("GET", path) as r:
        assert r.status_code == 200, (await r.aread())[:500]
        async for chunk in r.aiter_raw():
            digest.update(chunk)
            size += len(chunk)
        return size, digest.hexdigest(), r.headers


async def _finished(client: httpx.AsyncClient, job_id: str) -> dict[str, object] | None:
    job: dict[str, object] = (await client.get(f"/v1/jobs/{job_id}")).json()
    return job if job["state"] in ("succeeded", "failed", "dead", "lost", "cancelled", "expired") else None


async def test_a_20_mib_result_travels_by_reference_and_is_collected_with_its_job(
    database_url: str, tmp_path: Path, artifacts: Artifacts
) -> None:
    env = {"TENURE_APP": APP, "TENURE_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()), **artifacts.env}
    # Encoding 20 MiB of JSON holds the GIL for a few tenths of a second even in a thread: a claim TTL that
    # forgives it on a busy machine (this test is about where the bytes go, not about detecting a lost owner).
    env.update({"TENURE_HEARTBEAT_S": "1", "TENURE_CLAIM_TTL_S": "6"})
    port = free_port()
    gateway = TenureProc(database_url, tmp_path, "gateway", ["gateway", "--app", APP, "--port", str(port)], env=env)
    procs: list[TenureProc] = [gateway]
    url = f"http://127.0.0.1:{port}"
    try:

        async def up() -> bool:
            assert gateway.proc.poll() is None, gateway.log()
            try:
                async with httpx.AsyncClient() as c:
                    return (await c.get(url + "/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(up, 30, "the gateway to answer")
        procs.append(WorkerProc(database_url, tmp_path, "worker", app=APP, env=env))
        async with (
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}, timeout=60) as a,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['tenant-b']}"}, timeout=60) as b,
        ):
            expected = dumps({"data": payload(SIZE)}).encode()
            digest = hashlib.sha256(expected).hexdigest()
            r = await a.post("/v1/jobs", json={"agent": "big_result", "input": {"size": SIZE}})
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            small = (await a.post("/v1/jobs", json={"agent": "big_result", "input": {"size": 100}})).json()["id"]
            evidence = (await a.post("/v1/jobs", json={"agent": "big_evidence", "input": {"size": MiB}})).json()["id"]
            for jid in (job_id, small, evidence):
                job = await eventually(lambda jid=jid: _finished(a, jid), 90, f"job {jid} to end")
                assert job["state"] == "succeeded", (job, procs[1].log())

            # The job row stays small: it holds the reference, the digest and the size.
            view = await a.get(f"/v1/jobs/{job_id}")
            assert len(view.content) < 2048
            ref = f"{job_id}.{digest}"
            assert view.json()["result"] == {"$artifact": ref, "size": len(expected), "sha256": digest}
            assert await _stored_result_length(database_url, job_id) < 300
            assert await asyncio.to_thread(artifacts.size, job_id, digest) == len(expected)
            assert not await asyncio.to_thread(artifacts.owned, small)  # under the threshold: inline
            assert (await a.get(f"/v1/jobs/{small}/result")).json() == {"data": payload(100)}

            # The gateway streams it: its peak RSS grows by far less than the result's 20 MiB.
            # (the artifact endpoint first, which warms up every code path of the stream)
            assert (await _download(a, f"/v1/artifacts/{ref}"))[:2] == (len(expected), digest)
            _reset_peak(gateway.pid)
            before = _status_bytes(gateway.pid, "VmRSS")
            size, got, headers = await _download(a, f"/v1/jobs/{job_id}/result")
            growth = _status_bytes(gateway.pid, "VmHWM") - before
            assert (size, got) == (len(expected), digest)
            assert headers["content-length"] == str(len(expected)) and headers["etag"] == f'"{digest}"'
            assert growth < 10 * MiB, f"the gateway's peak RSS grew by {growth / MiB:.1f} MiB while streaming"
            print(f"gateway peak RSS growth while streaming {SIZE // MiB} MiB: {growth / MiB:.2f} MiB")
            cached = await a.get(f"/v1/jobs/{job_id}/result", headers={"If-None-Match": f'"{digest}"'})
            assert cached.status_code == 304

            # Evidence over the threshold: the audit holds its stub, the artifact endpoint its bytes.
            (record,) = (await a.get(f"/v1/jobs/{evidence}/audit")).json()["evidence"]
            stub = record["content"]
            evidence_bytes = dumps(payload(MiB)).encode()
            assert stub["sha256"] == hashlib.sha256(evidence_bytes).hexdigest() and stub["size"] == len(evidence_bytes)
            assert (await _download(a, f"/v1/artifacts/{stub['$artifact']}"))[:2] == (len(evidence_bytes), stub["sha256"])

            # The Python clients: over HTTP, and on the store itself (the row, then the artifact store)
            async with Client(url, KEYS["tenant-a"]) as http:
                assert await http.result(small) == {"data": payload(100)} and await http.result(evidence) == "ok"
            settings = Settings.of(
                database_url=database_url,
                artifacts_dir=env.get("TENURE_ARTIFACTS_DIR"),
                artifacts_url=env.get("TENURE_ARTIFACTS_URL"),
            )
            async with connect(APP, settings=settings) as local:
                assert dumps(await local.result(job_id, "tenant-a")).encode() == expected
                assert await local.result(small) == {"data": payload(100)}

            shown = tenure(database_url, "job", job_id)  # `tenure job ID` prints the reference, not the bytes
            assert shown.returncode == 0 and f'"$artifact": "{ref}"' in shown.stdout and len(shown.stdout) < 4096

            # Another tenant's key: 404 on both endpoints, like a job that does not exist.
            for path in (f"/v1/jobs/{job_id}/result", f"/v1/artifacts/{ref}", f"/v1/artifacts/{stub['$artifact']}"):
                r = await b.get(path)
                assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json", (path, r.text[:200])
            for path in (f"/v1/artifacts/{job_id}.{'0' * 64}", "/v1/artifacts/not-a-ref", f"/v1/artifacts/{small}.x"):
                assert (await a.get(path)).status_code == 404, path

            # The collector: the retention purge deletes the jobs and then their artifacts.
            procs[1].signal(15)
            procs[1].wait(30)
            retention = {**env, "TENURE_RETENTION_DAYS": str(1 / 86400)}  # one second
            procs.append(WorkerProc(database_url, tmp_path, "sweeper", app=APP, env=retention))

            async def collected() -> bool:
                gone = [not await asyncio.to_thread(artifacts.owned, jid) for jid in (job_id, evidence)]
                return all(gone)

            await eventually(collected, 60, "the retention to delete the artifacts")
            assert (await a.get(f"/v1/jobs/{job_id}")).status_code == 404
            assert (await a.get(f"/v1/artifacts/{ref}")).status_code == 404
    finally:
        for p in procs:
            p.stop()
