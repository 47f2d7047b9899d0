"""Tenure (PostgreSQL or SQLite), for the peersbench harness.

Copied into the harness as `peersbench/peers/tenure_peer.py` by `bench/peers/run.sh`; kept in the Tenure
project so that it is reviewed with the code it measures.

Worker side: `tenure worker --app peersbench.peers.tenure_peer:app --concurrency C` (Tenure's own CLI), one
OS process per worker, started through the harness's WorkerGroup from the venv the harness runs in.

Drivers:
  * `tenure-pg`: PostgreSQL 15 (stock config, fsync on), schema `pb_tenure` in `peers_bench` (role peers),
    dropped and re-created before every run. Wake-up by LISTEN/NOTIFY.
  * `tenure-sqlite`: one SQLite file in /tmp (WAL, synchronous FULL, Tenure's default), deleted before every
    run. Wake-up by the jobs doorbell (inotify on `<db>-tenure-jobs`), adaptive polling of
    `PRAGMA data_version` as the floor.
  * `tenure-sqlite-normal`: the same with `TENURE_SQLITE_SYNCHRONOUS=NORMAL` (a WAL commit is not fsynced;
    the database stays consistent, the last commits may be lost in a power cut). Shown to price durability.

Enqueue: `tenure.connect(app, url)` then `LocalClient.submit_many` (one round trip per chunk of 1,000) for
backlogs, `LocalClient.submit` for single jobs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peersbench.core import PG_DSN, Job, WorkerSpec, venv_script
from peersbench.peers import BaseDriver, pkg_versions
from peersbench.record import job_body_async

import tenure
from tenure.settings import Settings

AGENT = "pb_job"
SCHEMA = "pb_tenure"
# A backlog is over the default cap on waiting jobs (TENURE_MAX_QUEUED, 500), which tenure.connect meets like the
# gateway (one admission door): the bench lifts it for its own backlogs.
BACKLOG_CAP = 10**9
SQLITE_PATH = Path(os.environ.get("PB_TENURE_SQLITE", "/tmp/peersbench-tenure.db"))
CHUNK = 1000

# The worker-side app (imported by `tenure worker --app peersbench.peers.tenure_peer:app`).
app = tenure.Tenure()


@app.agent(AGENT)
async def pb_job(ctx: tenure.Context, input: dict) -> None:
    await job_body_async(input["run"], input["jid"], input["t_enq"], input["sleep_s"])


def _settings(**values: Any) -> Settings:
    """`Settings.of` since issue 11; the constructor before it, so that the same driver measures an older
    checkout (session5-base) beside this one."""
    return getattr(Settings, "of", Settings)(**values)


def pg_url() -> str:
    # asyncpg passes unknown DSN query parameters to the server as settings: every connection of Tenure
    # (pool, claim connection, LISTEN connection) then works inside the per-run schema.
    return PG_DSN + ("&" if "?" in PG_DSN else "?") + f"search_path={SCHEMA}"


class Driver(BaseDriver):
    name = "tenure-pg"
    job_style = "async"

    def __init__(self) -> None:
        super().__init__()
        self._stack: contextlib.AsyncExitStack | None = None
        self.client: tenure.LocalClient | None = None

    # -- per-backend pieces ----------------------------------------------------------------------------------
    def database_url(self) -> str:
        return pg_url()

    def worker_env(self) -> dict[str, str]:
        return {}

    def settings(self) -> Settings:
        return _settings(database_url=self.database_url(), max_queued=BACKLOG_CAP, max_queued_per_tenant=BACKLOG_CAP)

    def reset(self) -> None:
        import psycopg

        with psycopg.connect(PG_DSN, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            c.execute(f"CREATE SCHEMA {SCHEMA}")

    def backend_versions(self) -> dict[str, str]:
        import psycopg

        v = pkg_versions("asyncpg")
        with psycopg.connect(PG_DSN) as c:
            v["postgresql"] = c.execute("SHOW server_version").fetchone()[0]
        return v

    def backend_describe(self) -> dict[str, Any]:
        return {
            "store": f"PostgreSQL, schema {SCHEMA} (dropped and re-created per run)",
            "postgres": "stock Debian postgresql-15 config (fsync=on, synchronous_commit=on); Tenure's claim "
            "connection sets synchronous_commit=off (claim_and_start turns it on for its own "
            "transaction: a started job is durable before its handler runs); an enqueue commits "
            "asynchronously, then waits for a durable flush barrier before it returns",
            "wakeup": "LISTEN/NOTIFY (one NOTIFY per enqueue batch) + poll floor 1 s",
        }

    # -- Driver API ------------------------------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        return {**pkg_versions("tenure"), **self.backend_versions()}

    def describe(self, spec: WorkerSpec) -> dict[str, Any]:
        return {
            "worker_cmd": f"tenure worker --app peersbench.peers.tenure_peer:app --concurrency {spec.concurrency}",
            "processes": f"{spec.processes} x `tenure worker` (1 OS process each)",
            "concurrency": spec.concurrency,
            **self.backend_describe(),
            "enqueue_many": f"tenure.connect(...).submit_many, chunks of {CHUNK} (one round trip each)",
            "enqueue_one": "tenure.connect(...).submit",
            "job": "async def agent, awaits asyncio.sleep; default agent options (max_attempts 3)",
            "env": {"TENURE_LOG_LEVEL": "warning", **self.worker_env()},
        }

    def setup(self) -> None:
        self.reset()

        async def _open() -> None:
            stack = contextlib.AsyncExitStack()
            # connect() applies the schema (migrate) before returning, so workers find it in place.
            self.client = await stack.enter_async_context(tenure.connect(app, settings=self.settings()))
            self._stack = stack

        self._arun(_open())

    def enqueue_many(self, jobs: Sequence[Job]) -> None:
        async def _go() -> None:
            assert self.client is not None
            for i in range(0, len(jobs), CHUNK):
                await self.client.submit_many([tenure.JobRequest(AGENT, j.kwargs()) for j in jobs[i : i + CHUNK]])

        self._arun(_go())

    def enqueue_one(self, job: Job) -> None:
        assert self.client is not None
        self._arun(self.client.submit(AGENT, job.kwargs()))

    def start_workers(self, spec: WorkerSpec) -> None:
        env = {
            "TENURE_DATABASE_URL": self.database_url(),
            "TENURE_APP": "peersbench.peers.tenure_peer:app",
            "TENURE_LOG_LEVEL": "warning",
            **self.worker_env(),
        }
        for i in range(spec.processes):
            self.group.spawn(
                [venv_script("tenure"), "worker", "--concurrency", str(spec.concurrency)],
                env,
                spec.log_dir / f"worker{i}.log",
            )

    def teardown(self) -> None:
        try:
            if self._stack is not None:
                self._arun(self._stack.aclose())
        finally:
            self._stack = None
            self.client = None
            self._close_runner()


class SqliteDriver(Driver):
    name = "tenure-sqlite"
    synchronous = "FULL"

    def database_url(self) -> str:
        return f"sqlite:///{SQLITE_PATH}"  # sqlite:////tmp/... (absolute path)

    def worker_env(self) -> dict[str, str]:
        return {"TENURE_SQLITE_SYNCHRONOUS": self.synchronous}

    def reset(self) -> None:
        from tenure.backends.sqlite import database_files

        for path in database_files(SQLITE_PATH):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def backend_versions(self) -> dict[str, str]:
        import sqlite3

        return {"sqlite": sqlite3.sqlite_version}

    def backend_describe(self) -> dict[str, Any]:
        return {
            "store": f"SQLite file {SQLITE_PATH} (deleted per run), WAL, synchronous={self.synchronous}",
            "wakeup": "doorbell file watched with inotify; adaptive polling of PRAGMA data_version (2-25 ms) as the floor",
        }

    def settings(self) -> Settings:
        # The enqueuer opens the store with the same durability the workers use.
        return _settings(
            database_url=self.database_url(),
            sqlite_synchronous=self.synchronous,
            max_queued=BACKLOG_CAP,
            max_queued_per_tenant=BACKLOG_CAP,
        )


class SqliteNormalDriver(SqliteDriver):
    name = "tenure-sqlite-normal"
    synchronous = "NORMAL"
