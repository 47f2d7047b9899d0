"""`tenure doctor`: is this deployment healthy? Part of the composition root (it opens the backends).

Checks, each `ok`, `warn` or `fail` (any `fail` makes the command exit 1):

    store       the configured store answers; its version
    clock       skew between this machine and the database server (every expiry uses the server's clock,
                but a machine far off makes logs, `--deadline-s` and operators' reading of times wrong)
    schema      the migration level against the one this code expects
    redis       TENURE_REDIS_URL (optional) answers; its version and clock skew
    workers     workers alive (heartbeat within 2 claim TTLs), by state (degraded or unhealthy = warn); none alive
                while jobs wait = fail
    stuck jobs  jobs still owned past their claim expiry by more than a grace: the sweeper is not running
    artifacts   the artifact store (TENURE_ARTIFACTS_DIR, its SQLite default, or the bucket of TENURE_ARTIFACTS_URL)
                takes a probe artifact, gives it back whole and deletes it; none configured = ok (results inline)
    vacuum      PostgreSQL: the oldest transaction holding back vacuum (warn past 60 s, fail past 10 min), dead rows
                of the jobs and events tables (warn past twice the live rows and 100,000), their sizes
"""

from __future__ import annotations

import platform
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import tenure
from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.errors import TenureError
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import JobStore
from tenure.contracts.types import JobFilter
from tenure.settings import Settings

STUCK_SCAN_LIMIT = 1000


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # ok | warn | fail
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def add(self, name: str, status: str, detail: str, **data: Any) -> None:
        self.checks.append(Check(name, status, detail, data))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


async def _skew(read_clock: Any) -> tuple[float, float]:
    """(server - local, uncertainty): the local clock is read on both sides of the round trip."""
    before = time.time()
    server = float(await read_clock())
    after = time.time()
    return server - (before + after) / 2, (after - before) / 2


async def diagnose(settings: Settings, *, max_skew_s: float = 1.0) -> Report:
    """Run every check against the configured store (and Redis, if configured)."""
    from tenure.app import open_backends

    report = Report()
    report.add(
        "tenure",
        "ok",
        f"tenure {tenure.__version__}, Python {platform.python_version()}",
        tenure=tenure.__version__,
        python=platform.python_version(),
    )
    try:
        backends = await open_backends(settings, migrate=False)
    except (TenureError, OSError) as exc:
        report.add("store", "fail", f"cannot open {_redact(settings.store.database_url)}: {exc}")
        return report
    try:
        await _check_store(report, backends.jobs, settings, max_skew_s)
        await _check_artifacts(report, backends.artifacts)
    finally:
        await backends.close()
    if settings.redis.url:
        await _check_redis(report, settings.redis.url, max_skew_s)
    else:
        report.add("redis", "ok", "not configured (TENURE_REDIS_URL unset): leases live in the store")
    return report


async def _check_store(report: Report, store: JobStore, settings: Settings, max_skew_s: float) -> None:
    try:
        version = await store.server_version()
        report.add(
            "store",
            "ok",
            f"{store.dialect} {version} at {_redact(settings.store.database_url)}",
            dialect=store.dialect,
            version=version,
        )
        skew, uncertainty = await _skew(store.server_time)
        status = "ok" if abs(skew) <= max_skew_s else "fail"
        report.add(
            "clock",
            status,
            f"database clock {skew:+.3f} s from this machine (±{uncertainty:.3f} s)",
            skew_s=skew,
            uncertainty_s=uncertainty,
            max_skew_s=max_skew_s,
        )
        level = await store.schema_version()
        latest = store.latest_schema_version()
        if level == latest:
            report.add("schema", "ok", f"at version {level}", level=level, expected=latest)
        elif level < latest:
            report.add(
                "schema",
                "fail",
                f"at version {level}, this code expects {latest}: run `tenure migrate`",
                level=level,
                expected=latest,
            )
        else:
            report.add(
                "schema",
                "fail",
                f"at version {level}, newer than this code ({latest}): upgrade tenure",
                level=level,
                expected=latest,
            )
            return
        if level == 0:
            return
        now = await store.server_time()
        await _check_workers(report, store, settings, now)
        await _check_stuck(report, store, settings, now)
        await _check_vacuum(report, store)
    except TenureError as exc:
        report.add("store", "fail", f"{exc.code}: {exc}")


async def _check_workers(report: Report, store: JobStore, settings: Settings, now: float) -> None:
    horizon = 2 * settings.worker.claim_ttl_s  # the registry marks a worker gone after this much silence
    workers = await store.list_workers(include_gone=False)
    alive = [w for w in workers if w.last_heartbeat is not None and now - w.last_heartbeat <= horizon]
    by_state: dict[str, int] = {}
    for w in alive:
        by_state[w.state.value] = by_state.get(w.state.value, 0) + 1
    queued = await store.list_jobs(JobFilter(state=JobState.QUEUED, limit=1))
    summary = ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "none"
    if not alive:
        status = "fail" if queued else "warn"
        detail = "no worker alive" + (" while jobs are queued" if queued else "")
    else:
        ailing = by_state.get(WorkerState.DEGRADED.value, 0) + by_state.get(WorkerState.UNHEALTHY.value, 0)
        status = "warn" if ailing else "ok"
        detail = f"{len(alive)} alive ({summary})"
    report.add(
        "workers", status, detail, alive=len(alive), by_state=by_state, silent=[w.id for w in workers if w not in alive]
    )


async def _check_stuck(report: Report, store: JobStore, settings: Settings, now: float) -> None:
    # Past its claim expiry, a job is the sweeper's within one sweep; a grace of a few sweeps (and a
    # heartbeat) keeps a sweep in progress from being reported.
    grace = 3 * settings.worker.sweep_interval_s + settings.worker.heartbeat_s
    stuck = []
    for state in (JobState.QUEUED, JobState.RUNNING, JobState.WAITING):
        for job in await store.list_jobs(JobFilter(state=state, limit=STUCK_SCAN_LIMIT)):
            expires = job.claim_expires_at
            if job.owner is not None and expires is not None and expires < now - grace:
                stuck.append(
                    {"job_id": job.id, "state": job.state.value, "owner": job.owner, "past_ttl_s": round(now - expires, 3)}
                )
    if stuck:
        report.add(
            "stuck_jobs",
            "fail",
            f"{len(stuck)} job(s) owned past their claim TTL: is a sweeper running (any live worker runs one)?",
            jobs=stuck,
        )
    else:
        report.add("stuck_jobs", "ok", f"none past their claim TTL ({STUCK_SCAN_LIMIT} newest per state)")


async def _check_artifacts(report: Report, artifacts: ArtifactStore | None) -> None:
    """Write, read back and delete a probe artifact under an owner of its own (`doctor-probe-<random>`, never a job
    id): what a worker's write, a gateway's stream and the retention's delete each need of the store."""
    if artifacts is None:
        report.add("artifacts", "ok", "none configured: results stay inline (at most 1 MiB)")
        return
    owner, probe = f"doctor-probe-{uuid.uuid4().hex}", f'"tenure doctor probe {time.time()}"'.encode()
    step = "write"
    try:
        ref = await artifacts.put(owner, probe)
        step = "read back"
        blob = await artifacts.open(owner, ref.sha256)
        if blob is None:
            raise OSError("the probe just written is not there")
        try:
            read = b"".join([chunk async for chunk in blob.chunks])
        finally:
            await blob.close()
        if read != probe:
            raise OSError(f"the probe came back as {len(read)} other bytes")
        step = "delete"
        await artifacts.delete_owners([owner])
    except (TenureError, OSError) as exc:
        report.add("artifacts", "fail", f"{artifacts.location}: cannot {step} a probe artifact: {exc}", step=step)
        return
    report.add("artifacts", "ok", f"{artifacts.location}: a probe artifact written, read back and deleted")


async def _check_redis(report: Report, url: str, max_skew_s: float) -> None:
    from tenure.backends.redis import RedisLeases

    leases = RedisLeases(url, timeout_s=3.0)
    try:
        version, _ = await leases.server_info()
        skew, uncertainty = await _skew(lambda: _redis_time(leases))
        report.add(
            "redis",
            "ok" if abs(skew) <= max_skew_s else "fail",
            f"Redis {version} at {_redact(url)}; clock {skew:+.3f} s (±{uncertainty:.3f} s)",
            version=version,
            skew_s=skew,
            uncertainty_s=uncertainty,
        )
    except TenureError as exc:
        report.add("redis", "fail", f"{_redact(url)}: {exc}")
    finally:
        await leases.close()


async def _redis_time(leases: Any) -> float:
    return float((await leases.server_info())[1])


def _redact(url: str) -> str:
    """Hide a password in a URL (`scheme://user:secret@host` → `scheme://user:***@host`)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


XMIN_WARN_S = 60.0
XMIN_FAIL_S = 600.0
DEAD_WARN = 100_000


async def _check_vacuum(report: Report, store: JobStore) -> None:
    """What SKIP LOCKED queues learn the hard way (docs/operations.md): a transaction left open anywhere in the
    cluster keeps every dead version of a claimed and finished job, and claims slow down as they pile up."""
    health = await store.health()
    sizes = ", ".join(f"{t} {_size(n)}" for t, n in sorted(health.table_bytes.items()))
    age = health.oldest_xmin_age_s
    if age is None:  # SQLite: no horizon, no dead rows
        report.add("vacuum", "ok", f"no vacuum horizon on {store.dialect}; {sizes}", table_bytes=health.table_bytes)
        return
    status = "fail" if age > XMIN_FAIL_S else "warn" if age > XMIN_WARN_S else "ok"
    piling = [
        t for t in ("jobs", "events") if health.dead_tuples.get(t, 0) > max(DEAD_WARN, 2 * health.live_tuples.get(t, 0))
    ]
    if piling and status == "ok":
        status = "warn"
    detail = f"oldest transaction holding back vacuum: {age:.0f} s"
    if health.oldest_xmin_holder and age > XMIN_WARN_S:
        detail += f" ({health.oldest_xmin_holder})"
    dead = ", ".join(
        f"{t} {health.dead_tuples.get(t, 0):,} dead / {health.live_tuples.get(t, 0):,} live" for t in ("jobs", "events")
    )
    report.add(
        "vacuum", status, f"{detail}; {dead}; {sizes}", oldest_xmin_age_s=age, holder=health.oldest_xmin_holder,
        dead_tuples=dict(health.dead_tuples), live_tuples=dict(health.live_tuples), table_bytes=dict(health.table_bytes),
    )  # fmt: skip


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n} TiB"
