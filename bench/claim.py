"""Drain benchmark of the claim → start → finish path of one Tenure store.

    .venv/bin/python bench/claim.py                                   # SQLite file in /tmp, 10,000 jobs
    .venv/bin/python bench/claim.py --synchronous NORMAL --reps 3
    .venv/bin/python bench/claim.py --database-url postgresql://peers:peers@127.0.0.1:5432/peers_bench

Each repetition starts from a fresh store (the SQLite file is deleted; on PostgreSQL the schema named by the
URL's `search_path` — `tenure_claim_bench` when the URL names none — is dropped and re-created), enqueues N
no-op jobs with `LocalClient.submit_many` (chunks of 1,000), then starts K `tenure worker` processes
(concurrency C each) from this interpreter's venv and waits until every job is terminal.

Reported, from the store's own clocks: drain jobs/s = N / (first `execution_started_at` → last
`finished_at`); jobs/s including worker start-up (launch → last finish); the enqueue rate; CPU seconds of the
worker processes (and of all PostgreSQL server processes, for Postgres) per job; foreign CPU (everything else
on the machine) to flag noise. A repetition is ok only if every job succeeded exactly once: state succeeded,
attempts 1, exactly one `executions` row, and its `execution.started` + `job.succeeded` events.

The worker-side app is this file (`--app claim:app`, with bench/ on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import tenure
from tenure.backends.sqlite import database_files
from tenure.settings import Settings

HERE = Path(__file__).resolve().parent
AGENT = "noop"
CHUNK = 1000
DEFAULT_SQLITE = "sqlite:////tmp/tenure-claim-bench.db"
DEFAULT_PG_SCHEMA = "tenure_claim_bench"
_TERMINAL = ("succeeded", "failed", "cancelled", "lost", "expired", "dead")

app = tenure.Tenure()

# A backlog is over the default cap on waiting jobs (TENURE_MAX_QUEUED, 500), which tenure.connect meets like the
# gateway (one admission door): the bench lifts it for its own backlogs.
BACKLOG_CAP = 10**9


_redis: Any = None


@app.agent(AGENT)
async def noop(ctx: tenure.Context, input: Any) -> None:
    if input["sleep_s"]:  # --sleep-ms: a job that waits on I/O this long (0: returns at once)
        await asyncio.sleep(input["sleep_s"])
    if input.get("redis"):  # --redis: one INCR round trip, like the peer harness's Lua call
        global _redis
        if _redis is None:
            import redis.asyncio

            _redis = redis.asyncio.Redis.from_url(input["redis"])
        await _redis.incr("tenure-claim-bench")


# -- stores: fresh state and read-only inspection ---------------------------------------------------------------
class Target:
    def __init__(self, url: str, synchronous: str) -> None:
        self.synchronous = synchronous
        self.is_sqlite = url.startswith("sqlite:")
        if self.is_sqlite:
            self.url = url
            self.path = url[len("sqlite:///") :]
            self.schema = None
        else:
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query))
            self.schema = query.setdefault("search_path", DEFAULT_PG_SCHEMA)
            if not self.schema.isidentifier() or self.schema in ("public", "pg_catalog"):
                raise SystemExit(f"refusing to drop schema {self.schema!r}: name a scratch schema in search_path")
            self.url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
            self.admin_url = urllib.parse.urlunsplit(
                parts._replace(query=urllib.parse.urlencode({k: v for k, v in query.items() if k != "search_path"}))
            )

    def label(self) -> str:
        return f"sqlite ({self.synchronous})" if self.is_sqlite else f"postgres ({self.schema})"

    async def reset(self) -> None:
        if self.is_sqlite:
            for path in database_files(self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return
        import asyncpg

        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {self.schema}")
        finally:
            await conn.close()

    def settings(self) -> Settings:
        return Settings.of(
            database_url=self.url,
            sqlite_synchronous=self.synchronous,
            max_queued=BACKLOG_CAP,
            max_queued_per_tenant=BACKLOG_CAP,
        )

    async def open(self) -> None:
        """One connection for polling and verification (a new Postgres connection per poll costs a fork)."""
        if self.is_sqlite:
            self._conn: Any = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        else:
            import asyncpg

            self._conn = await asyncpg.connect(self.url)

    async def close(self) -> None:
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is not None:
            await conn.close() if not self.is_sqlite else conn.close()

    async def query(self, sql_sqlite: str, sql_pg: str) -> list[tuple[Any, ...]]:
        if self.is_sqlite:
            return self._conn.execute(sql_sqlite).fetchall()
        return [tuple(r) for r in await self._conn.fetch(sql_pg)]

    async def transactions(self) -> int | None:
        """Committed + rolled-back transactions of the whole database so far (PostgreSQL; the statistics
        collector lags by up to 0.5 s, and other users of the database count too)."""
        if self.is_sqlite:
            return None
        await self._conn.execute("SELECT pg_stat_clear_snapshot()")
        await asyncio.sleep(0.6)
        return int(
            await self._conn.fetchval(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            )
        )

    async def unfinished(self) -> int:
        states = ",".join(f"'{s}'" for s in _TERMINAL)
        sql = f"SELECT count(*) FROM jobs WHERE state NOT IN ({states})"
        return int((await self.query(sql, sql))[0][0])

    async def verify(self, n: int) -> dict[str, Any]:
        lite = """
            SELECT count(*), sum(state = 'succeeded'), sum(attempts = 1), sum(epoch = 1),
                   min(execution_started_at), max(finished_at),
                   (SELECT count(*) FROM executions), (SELECT count(DISTINCT job_id) FROM executions),
                   (SELECT count(*) FROM executions WHERE outcome = 'succeeded'),
                   (SELECT count(*) FROM events WHERE type = 'execution.started'),
                   (SELECT count(*) FROM events WHERE type = 'job.succeeded'),
                   (SELECT count(*) FROM events),
                   count(DISTINCT claimed_at), count(DISTINCT finished_at)
              FROM jobs"""
        pg = """
            SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE attempts = 1),
                   count(*) FILTER (WHERE epoch = 1),
                   extract(epoch FROM min(execution_started_at))::float8, extract(epoch FROM max(finished_at))::float8,
                   (SELECT count(*) FROM executions), (SELECT count(DISTINCT job_id) FROM executions),
                   (SELECT count(*) FROM executions WHERE outcome = 'succeeded'),
                   (SELECT count(*) FROM events WHERE type = 'execution.started'),
                   (SELECT count(*) FROM events WHERE type = 'job.succeeded'),
                   (SELECT count(*) FROM events),
                   count(DISTINCT claimed_at), count(DISTINCT finished_at)
              FROM jobs"""
        (
            jobs,
            succeeded,
            attempts1,
            epoch1,
            first_start,
            last_finish,
            execs,
            exec_jobs,
            exec_ok,
            ev_started,
            ev_succeeded,
            ev_total,
            claim_times,
            finish_times,
        ) = (await self.query(lite, pg))[0]
        ok = (
            jobs == n
            and succeeded == n
            and attempts1 == n
            and execs == n
            and exec_jobs == n
            and exec_ok == n
            and ev_started == n
            and ev_succeeded == n
        )
        return {
            "ok": bool(ok),
            "jobs": jobs,
            "succeeded": succeeded,
            "attempts_1": attempts1,
            "claimed_once": epoch1,
            "executions": execs,
            "jobs_with_execution": exec_jobs,
            "events": ev_total,
            "first_start": first_start,
            "last_finish": last_finish,
            # Jobs per claim and per finish transaction: one transaction stamps its rows with one now()
            # (PostgreSQL; SQLite's clock advances between statements, so its finish figure means nothing).
            "jobs_per_claim": round(n / claim_times, 2) if claim_times else None,
            "jobs_per_finish": None if self.is_sqlite or not finish_times else round(n / finish_times, 2),
        }


# -- CPU accounting from /proc ---------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _snapshot() -> dict[int, tuple[str, float, str]]:
    """pid -> (comm, cpu s, starttime) for every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) / _TICK, fields[19])
    return out


def _cpu_by_kind(
    before: dict[int, tuple[str, float, str]], after: dict[int, tuple[str, float, str]], workers: set[int]
) -> dict[str, float]:
    """CPU used between two snapshots: by our workers, by postgres processes, by everything else."""
    me = os.getpid()
    out = {"workers": 0.0, "postgres": 0.0, "bench": 0.0, "foreign": 0.0}
    for pid, (comm, cpu, start) in after.items():
        old = before.get(pid)
        delta = cpu - old[1] if old is not None and old[2] == start else cpu
        if delta <= 0:
            continue
        if pid in workers:
            out["workers"] += delta
        elif comm.startswith("postgres"):
            out["postgres"] += delta
        elif pid == me:
            out["bench"] += delta
        else:
            out["foreign"] += delta
    return {k: round(v, 3) for k, v in out.items()}


def _interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """The sampled value at time t (linear between samples; clamped at the ends)."""
    if not samples:
        return 0.0
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
    return samples[-1][1]


# -- one repetition --------------------------------------------------------------------------------------------
def _tenure_script() -> str:
    path = Path(sys.executable).parent / "tenure"
    if not path.exists():
        raise SystemExit(f"{path} not found: run with the venv's python (where tenure is installed)")
    return str(path)


def _launch(
    args: argparse.Namespace, env: dict[str, str], log_dir: Path, procs: list[subprocess.Popen[bytes]], logs: list[Any]
) -> None:
    """Start the worker processes, each in its own session (so that only they are signalled later)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for i in range(args.workers):
        log = open(log_dir / f"worker{i}.log", "wb")  # closed by run_once after the run
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [_tenure_script(), "worker", "--concurrency", str(args.concurrency)],
                env=env,
                cwd=str(HERE),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )


async def run_once(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    rec: dict[str, Any] = {
        "store": target.label(),
        "n": n,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "sleep_ms": args.sleep_ms,
    }
    await target.reset()
    async with tenure.connect(app, settings=target.settings()) as client:
        t0 = time.perf_counter()
        for i in range(0, n, CHUNK):
            await client.submit_many(
                [
                    tenure.JobRequest(AGENT, {"i": j, "sleep_s": args.sleep_ms / 1000, "redis": args.redis})
                    for j in range(i, min(n, i + CHUNK))
                ]
            )
        enq_s = time.perf_counter() - t0
    rec["enqueue_s"] = round(enq_s, 4)
    rec["enqueue_jobs_s"] = round(n / enq_s, 1)

    env = dict(os.environ)
    env.update(
        {
            "TENURE_DATABASE_URL": target.url,
            "TENURE_APP": args.worker_app,
            "TENURE_LOG_LEVEL": "warning",
            "TENURE_SQLITE_SYNCHRONOUS": target.synchronous,
            "PYTHONPATH": str(HERE) + os.pathsep + env.get("PYTHONPATH", ""),
        }
    )
    log_dir = Path(args.log_dir)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    await target.open()
    xacts0 = await target.transactions()
    snap0 = _snapshot()
    t_launch = time.time()
    try:
        _launch(args, env, log_dir, procs, logs)
        deadline = time.monotonic() + args.timeout
        samples: list[tuple[float, float]] = []  # (time, CPU s of the workers): start-up CPU is left out below
        while True:
            await asyncio.sleep(0.05)
            samples.append((time.time(), sum(_proc_cpu(p.pid) for p in procs)))
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker {p.pid} exited with code {p.returncode} (see {log_dir})")
            if await target.unfinished() == 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"not drained after {args.timeout}s")
        snap1 = _snapshot()
        rec["cpu_s"] = _cpu_by_kind(snap0, snap1, {p.pid for p in procs})
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        for log in logs:
            log.close()
    try:
        xacts1 = await target.transactions()  # after the workers' backends exited (they flush their statistics)
        if xacts0 is not None and xacts1 is not None:
            rec["transactions_per_job"] = round((xacts1 - xacts0) / n, 3)
        v = await target.verify(n)
    finally:
        await target.close()
    rec.update(v)
    drain = v["last_finish"] - v["first_start"]
    wall = v["last_finish"] - t_launch
    rec["startup_s"] = round(v["first_start"] - t_launch, 4)
    rec["drain_s"] = round(drain, 4)
    rec["drain_jobs_s"] = round(n / drain, 1)
    rec["jobs_s_incl_startup"] = round(n / wall, 1)
    cpu = rec["cpu_s"]
    rec["worker_cpu_ms_per_job"] = round(cpu["workers"] * 1000 / n, 3)
    at_start = _interpolate(samples, v["first_start"])
    rec["worker_cpu_drain_s"] = round(samples[-1][1] - at_start, 3)
    rec["worker_cpu_drain_ms_per_job"] = round(rec["worker_cpu_drain_s"] * 1000 / n, 3)
    rec["postgres_cpu_ms_per_job"] = None if target.is_sqlite else round(cpu["postgres"] * 1000 / n, 3)
    return rec


# -- report ----------------------------------------------------------------------------------------------------
def _median(runs: list[dict[str, Any]], key: str) -> Any:
    xs = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(xs), 3) if xs else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("ok")]
    keys = (
        "drain_jobs_s",
        "jobs_s_incl_startup",
        "enqueue_jobs_s",
        "worker_cpu_ms_per_job",
        "worker_cpu_drain_ms_per_job",
        "postgres_cpu_ms_per_job",
        "transactions_per_job",
        "jobs_per_claim",
        "jobs_per_finish",
    )
    out: dict[str, Any] = {"reps": len(runs), "reps_ok": len(ok)}
    for k in keys:
        out[k] = {
            "median": _median(ok, k),
            "min": min((r[k] for r in ok if r.get(k) is not None), default=None),
            "max": max((r[k] for r in ok if r.get(k) is not None), default=None),
        }
    out["foreign_cpu_s_max"] = max((r["cpu_s"]["foreign"] for r in runs if "cpu_s" in r), default=None)
    return out


def render(runs: list[dict[str, Any]], summary: dict[str, Any], store: str) -> str:
    def fmt(x: Any) -> str:
        if x is None:
            return "–"
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"

    rows = [
        ("drain jobs/s (first start → last finish)", "drain_jobs_s"),
        ("jobs/s incl. worker start-up", "jobs_s_incl_startup"),
        ("enqueue jobs/s (submit_many, 1,000 per call)", "enqueue_jobs_s"),
        ("worker CPU ms per job, incl. start-up (both processes)", "worker_cpu_ms_per_job"),
        ("worker CPU ms per job, drain window only", "worker_cpu_drain_ms_per_job"),
        ("postgres CPU ms per job (all server processes, launch → drained)", "postgres_cpu_ms_per_job"),
        ("postgres transactions per job (whole database, launch → drained)", "transactions_per_job"),
        ("jobs per claim transaction", "jobs_per_claim"),
        ("jobs per finish transaction (PostgreSQL)", "jobs_per_finish"),
    ]
    lines = [
        f"store: {store}; N={runs[0]['n']}; {runs[0]['workers']} workers x concurrency {runs[0]['concurrency']}; "
        f"job sleep {runs[0].get('sleep_ms', 0):g} ms; "
        f"reps ok {summary['reps_ok']}/{summary['reps']}; foreign CPU s (max) {summary['foreign_cpu_s_max']}",
        "",
        "| metric | median | min | max |",
        "|---|---:|---:|---:|",
    ]
    for label, key in rows:
        s = summary[key]
        if s["median"] is None:
            continue
        lines.append(f"| {label} | {fmt(s['median'])} | {fmt(s['min'])} | {fmt(s['max'])} |")
    lines.append("")
    lines.append(
        "| rep | ok | drain jobs/s | incl. start-up | enqueue jobs/s | worker CPU s | postgres CPU s "
        "| foreign CPU s | claimed once |"
    )
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(runs, 1):
        c = r.get("cpu_s", {})
        lines.append(
            f"| {i} | {r.get('ok')} | {fmt(r.get('drain_jobs_s'))} | {fmt(r.get('jobs_s_incl_startup'))} "
            f"| {fmt(r.get('enqueue_jobs_s'))} | {c.get('workers', '–')} | {c.get('postgres', '–')} "
            f"| {c.get('foreign', '–')} | {r.get('claimed_once', '–')} |"
        )
        if r.get("error"):
            lines.append(f"|  | error: {r['error']} |  |  |  |  |  |  |  |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> tuple[Target, list[dict[str, Any]]]:
    target = Target(args.database_url, args.synchronous)
    runs = []
    for rep in range(1, args.reps + 1):
        try:
            rec = await run_once(target, args)
        except Exception as exc:
            rec = {
                "store": target.label(),
                "n": args.n,
                "workers": args.workers,
                "concurrency": args.concurrency,
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
            }
        rec["rep"] = rep
        runs.append(rec)
        print(
            f"[claim] rep {rep}: ok={rec.get('ok')} drain={rec.get('drain_jobs_s')} jobs/s "
            f"enqueue={rec.get('enqueue_jobs_s')} jobs/s cpu={rec.get('cpu_s')} {rec.get('error', '')}",
            file=sys.stderr,
            flush=True,
        )
    return target, runs


def report(args: argparse.Namespace, target: Target, runs: list[dict[str, Any]]) -> int:
    summary = summarize(runs)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "store": target.label(),
                    "database_url": target.url,
                    "synchronous": args.synchronous,
                    "n": args.n,
                    "workers": args.workers,
                    "concurrency": args.concurrency,
                    "sleep_ms": args.sleep_ms,
                    "reps": args.reps,
                    "loadavg": os.getloadavg(),
                    "python": sys.version.split()[0],
                    "sqlite": sqlite3.sqlite_version,
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
            + "\n"
        )
    print(render(runs, summary, target.label()))
    return 0 if summary["reps_ok"] == summary["reps"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--database-url",
        default=DEFAULT_SQLITE,
        help=f"store to measure (default {DEFAULT_SQLITE}); it is wiped before every repetition",
    )
    ap.add_argument("-n", type=int, default=10_000, help="jobs per repetition (default 10,000)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--concurrency", type=int, default=10, help="slots per worker (default 10)")
    ap.add_argument(
        "--sleep-ms", type=float, default=0.0, help="each job awaits asyncio.sleep this long (default 0: a no-op job)"
    )
    ap.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="each job also makes one INCR round trip to this Redis (like the peer harness's job)",
    )
    ap.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL"),
        default="FULL",
        help="SQLite synchronous (TENURE_SQLITE_SYNCHRONOUS; default FULL, Tenure's default)",
    )
    ap.add_argument("--reps", type=int, default=1, help="repetitions; the table shows median/min/max")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up a repetition after this many seconds")
    ap.add_argument("--out", help="write the runs and summary as JSON here")
    ap.add_argument(
        "--worker-app",
        default="claim:app",
        help="the workers' app (module:attr, with an agent named 'noop'; bench/ is on PYTHONPATH)",
    )
    ap.add_argument("--log-dir", default="/tmp/tenure-claim-bench-logs", help="worker logs")
    args = ap.parse_args()
    target, runs = asyncio.run(main_async(args))
    return report(args, target, runs)


if __name__ == "__main__":
    sys.exit(main())
