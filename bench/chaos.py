"""The chaos run: thousands of jobs of four kinds through two gateways and four workers while a fault scheduler,
driven by a printed seed, kills, freezes and cuts off the processes and services under them; then an invariant
checker reads the store, the side-effect counters and the mock model's counters and prints one verdict line.

    .venv/bin/python bench/chaos.py --jobs 10000 --seed 16 --database-url postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/chaos.py --profile bounded --seed 17                # SQLite, 1,000 jobs (make test's)
    .venv/bin/python bench/chaos.py --seed 16 --plan-only                      # print the fault schedule and stop

The last line reads

    chaos: jobs=N faults=F nonterminal=0 double_effects=0 stale_writes=0 quota_over=0 r429=0 stream_mismatch=0 jobs_per_s=X

and the exit status is 0 only when every count on it (and on the `checks:` line before it) is zero.

What runs (all real processes, started the way a user starts them; `tenure` is `python -m tenure.cli`):

- the store: with `--database-url postgresql://HOST/DB` the run creates a database of its own on that server
  (`chaos_<seed>_<random>`, dropped afterwards unless `--keep`), so that terminating "Tenure's connections"
  touches nobody else's; without it, a SQLite file in the run's directory;
- on PostgreSQL, a private `redis-server` (no persistence) on a free port, unless `--redis-url none` (no Redis)
  or `--redis-url URL` (a Redis this run may flush: it is FLUSHALLed, and its "restart" is every client
  connection killed plus a FLUSHALL, which is what a restart without persistence looks like to its clients);
- `tenure mock-model`, whose limit is twice the quota (so that a quota overrun shows as a peak over the quota
  in its counters rather than only as 429s, and a gross one as 429s as well);
- two `tenure gateway` processes and four `tenure worker` processes (`bench/chaos_app.py` is the app), each in
  a session of its own; this script is their supervisor: a process it killed is started again after the delay
  the schedule says, and a process that exits without being killed is an unexpected exit (counted, restarted).

The job mix (from the seed): `safe` (retry-safe, some fail their first attempt), `effect` (NOT retry-safe: one
line per run appended to its own counter file, half-way through), `chat` (the bundled chat agent under the
quota `llm:mock` against the mock model) and `stream` (paced `tick` events). Jobs are submitted over HTTP at a
fixed pace, alternating gateways, each with an idempotency key; a refused or failed POST (transport error, 5xx,
the gateway's own 429) is retried with the same key, on the other gateway. Every `stream` job and one `chat`
job in ten is followed over SSE by a client that disconnects at random points (and whenever its gateway dies)
and resumes with `Last-Event-ID`, on either gateway.

The fault schedule is a pure function of (seed, fault kinds, window, faults per kind, workers, claim TTL):
the same seed replays the same schedule (`--plan-only` prints it). Kinds:

    worker_kill     SIGKILL of a worker; restarted after the planned delay
    worker_stop     SIGSTOP of a worker for longer than the claim TTL (TTL + 0.5..2.5 s), then SIGCONT
    redis_restart   the private redis-server killed, down for 0.5..2 s, started again empty
    redis_flushall  FLUSHALL
    pg_terminate    pg_terminate_backend() of every connection of the run's database whose application_name
                    is Tenure's (`tenure-*`: pool, claim, listen, channel)
    gateway_kill    SIGKILL of a gateway; restarted after the planned delay

On SQLite there is no Redis and no PostgreSQL, so only worker_kill, worker_stop and gateway_kill apply.

Invariants, and how each is checked once the faults have stopped and the bounds have passed (every job that
is not terminal by then counts; the bound is the queue deadline + the agents' timeout + the claim TTL + two
sweeps + 10 s after the later of the last fault and the last admission, but the wait ends as soon as every job
is terminal and every follower is done):

- nonterminal      jobs not in a terminal state (succeeded, failed, cancelled, lost, expired, dead).
- double_effects   `effect` jobs whose counter file has more than one line. (A succeeded `effect` job with no
                   line is counted on the checks line as `effects_missing`.)
- stale_writes     rows the store accepted that only a writer holding an outdated fence could have written. An
                   epoch names one claim, and a claim runs at most one execution, so per (job, epoch) the
                   store must show: at most one `executions` row; every event that names an execution naming
                   that one (an event of the epoch's execution from another execution id is a stale append);
                   at most one closing event (`job.<terminal>`, `execution.lost`, `execution.retrying`) and no
                   event after it (an append or a finish accepted after the sweeper or a finish closed the
                   execution) — except the job's own end while it waits unowned for its next attempt: after
                   `execution.retrying` or `execution.lost`, one `job.<terminal>` of no execution (a retry
                   expired past its queue deadline, or cancelled), as the epoch's last event; no `executions` row for an epoch the job never reached; at most one
                   `succeeded` execution per job, at its current epoch; and the job row's own finish agrees
                   with its current epoch: a terminal job with an execution id has that id recorded for its
                   epoch, and its epoch's closing event is `job.<its state>`.
- quota_over       the mock model's peak of requests in flight minus the quota (when positive): the quota
                   `llm:mock` is held around every call, so the model must never see more calls at once.
- r429             the mock model's 429s (it answers 429 beyond twice the quota).
- stream_mismatch  followed streams whose concatenation (over every disconnect and resume, across gateways)
                   differs from the job's durable history read from the store afterwards (same events, same
                   order, no gap, no duplicate, same payloads), or that never reached the terminal event.
- jobs_per_s       terminal jobs / (last finish - first admission), on the store's clock: faults are injected
                   over the whole admission window, so this is the rate achieved under faults.

The `checks:` line adds what the verdict does not name: jobs admitted vs rows in the store (an idempotency key
answered twice makes a duplicate job), holes in an epoch's `seq` (a lost event), executions started but never
recorded, results that disagree with their input or with the events of their final epoch, succeeded effects
without their line, and processes that exited without being killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable

# Fast timings, as the integration tests use, with a wider margin: a loaded 2-core machine delays heartbeats.
HEARTBEAT_S = 0.5
CLAIM_TTL_S = 2.5
SWEEP_S = 0.25
AGENT_TIMEOUT_S = 60.0  # chaos_app.TIMEOUT_S
QUOTA = 4
MODEL_LIMIT = 2 * QUOTA
MODEL_TOKENS = 8
CHAT_LOAD = 0.6  # the share of the quota's capacity the chat jobs ask for: the quota is often full, never swamped


def model_latency_ms(rate: float) -> int:
    """The mock's latency for a submission rate: a call takes about twice the latency, and chat jobs arrive at
    MIX's share of the rate, so this keeps them asking for CHAT_LOAD of what QUOTA slots can serve."""
    chat_share = dict(MIX)["chat"]
    return max(20, min(1000, round(1000 * CHAT_LOAD * QUOTA / (chat_share * rate) / 2)))


WORKERS = 4
GATEWAYS = 2
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost", "expired", "dead"})
TERMINAL_EVENTS = frozenset(f"job.{s}" for s in TERMINAL)
EXECUTION_CLOSES = frozenset({"execution.lost", "execution.retrying"})
CLOSING_EVENTS = TERMINAL_EVENTS | EXECUTION_CLOSES
MIX = (("safe", 0.35), ("effect", 0.25), ("chat", 0.20), ("stream", 0.20))
ALL_KINDS = ("worker_kill", "worker_stop", "redis_restart", "redis_flushall", "pg_terminate", "gateway_kill")


PROFILES: dict[str, dict[str, Any]] = {
    "full": {"jobs": 10000, "rate": 40.0, "faults_per_kind": 5, "deadline_s": 120.0},
    # make test (tests/integration/test_chaos.py): about a minute on the 2-core machine, under 4 minutes loaded.
    "bounded": {"jobs": 1000, "rate": 25.0, "faults_per_kind": 2, "deadline_s": 60.0},
}


def say(text: str) -> None:
    print(f"chaos: {text}", flush=True)


# -- the plan: a pure function of the seed ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """One planned fault: at `at_s` seconds into the window, `kind` on `target` (a worker or gateway index)."""

    at_s: float
    kind: str
    target: int | None = None
    duration_s: float = 0.0  # freeze length, Redis downtime, or delay before a killed process is restarted

    def describe(self) -> str:
        who = {"worker_kill": "w", "worker_stop": "w", "gateway_kill": "g"}.get(self.kind, "")
        target = f" {who}{self.target}" if self.target is not None else ""
        extra = f" {self.duration_s:.2f}s" if self.duration_s else ""
        return f"+{self.at_s:7.2f}s {self.kind}{target}{extra}"


def plan_faults(
    seed: int, kinds: Iterable[str], window_s: float, per_kind: int, workers: int, gateways: int, ttl_s: float
) -> list[Fault]:
    """The fault schedule: `per_kind` of each kind at least, and about one fault every 3 s over `window_s` in all,
    in a random order at random gaps. A target is never hit again while it is still frozen, down or restarting,
    and Redis is never hit while it is down: a fault waits for its target instead."""
    rng = random.Random(f"{seed}:faults")
    kinds = list(kinds)
    total = max(per_kind * len(kinds), int(window_s / 3))
    order = [k for k in kinds for _ in range(per_kind)]
    order += [rng.choice(kinds) for _ in range(total - len(order))]
    rng.shuffle(order)
    gap = max(0.2, (window_s - 2.0) / max(1, len(order)))
    t = 1.0
    busy_worker = [0.0] * workers
    busy_gateway = [0.0] * gateways
    redis_up_at = 0.0
    out: list[Fault] = []
    for kind in order:
        t += rng.uniform(0.4 * gap, 1.6 * gap)
        if kind in ("worker_kill", "worker_stop"):
            free = [i for i in range(workers) if busy_worker[i] <= t]
            if not free:
                t = min(busy_worker)
                free = [i for i in range(workers) if busy_worker[i] <= t]
            target = rng.choice(free)
            if kind == "worker_stop":
                duration = ttl_s + rng.uniform(0.5, 2.5)
            else:
                duration = rng.uniform(0.3, 1.5)
            busy_worker[target] = t + duration + 1.0
            out.append(Fault(round(t, 3), kind, target, round(duration, 3)))
        elif kind == "gateway_kill":
            free = [i for i in range(gateways) if busy_gateway[i] <= t]
            if not free:
                t = min(busy_gateway)
                free = [i for i in range(gateways) if busy_gateway[i] <= t]
            target = rng.choice(free)
            duration = rng.uniform(0.3, 1.5)
            busy_gateway[target] = t + duration + 1.5
            out.append(Fault(round(t, 3), kind, target, round(duration, 3)))
        elif kind in ("redis_restart", "redis_flushall"):
            t = max(t, redis_up_at)
            duration = rng.uniform(0.5, 2.0) if kind == "redis_restart" else 0.0
            redis_up_at = t + duration + 0.5
            out.append(Fault(round(t, 3), kind, None, round(duration, 3)))
        else:
            out.append(Fault(round(t, 3), kind))
    return out


def plan_jobs(seed: int, n: int) -> list[tuple[str, dict[str, Any], bool]]:
    """(agent, input, followed over SSE) for each job, from the seed."""
    rng = random.Random(f"{seed}:jobs")
    agents = [a for a, _ in MIX]
    weights = [w for _, w in MIX]
    out: list[tuple[str, dict[str, Any], bool]] = []
    for i in range(n):
        agent = rng.choices(agents, weights)[0]
        if agent == "safe":
            steps = rng.randint(1, 4)
            inp: dict[str, Any] = {
                "n": i,
                "steps": steps,
                "sleep_s": round(rng.uniform(0.05, 0.6), 3),
                "fail_first": rng.random() < 0.15,
            }
            followed = False
        elif agent == "effect":
            inp = {"n": i, "before_s": round(rng.uniform(0.05, 0.5), 3), "after_s": round(rng.uniform(0.05, 0.5), 3)}
            followed = False
        elif agent == "chat":
            words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega")) for _ in range(rng.randint(1, 4)))
            inp = {"prompt": f"job{i} {words}", "max_tokens": MODEL_TOKENS}
            followed = rng.random() < 0.1
        else:
            inp = {"n": i, "count": rng.randint(10, 40), "every_s": round(rng.uniform(0.01, 0.04), 3)}
            followed = True
        out.append((agent, inp, followed))
    return out


def expected_chat_text(prompt: str, max_tokens: int) -> str:
    """What the mock model answers (docs/mock-model.md): the prompt's words cycled to the token count."""
    words = prompt.split() or ["mock"]
    count = min(MODEL_TOKENS, max_tokens)
    return " ".join(words[i % len(words)] for i in range(count))


# -- processes ------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Managed:
    """One supervised process: started again after it dies, whether it was killed (planned) or not."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.unexpected: list[str] = []  # deaths nobody planned, of a process that had started
        self.startup_failures: list[str] = []  # exits during start-up, with the CLI's error line
        self.stopping = False
        self.frozen = False
        self._killed_by_us = False
        self._restart_after = 0.5
        self._started_at = 0.0
        self._log_offset = 0
        self._watch: asyncio.Task[None] | None = None
        self.up = asyncio.Event()

    async def start(self) -> None:
        self.starts += 1
        self._started_at = time.monotonic()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts} at {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )
        self._killed_by_us = False
        self._watch = asyncio.create_task(self._watch_exit(self.proc))

    async def _watch_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.up.clear()
        if self.stopping:
            return
        if self._killed_by_us:
            delay = self._restart_after
        else:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                lines = log.read().decode(errors="replace").splitlines()
            error = next((line for line in reversed(lines) if line.startswith("tenure: ")), None)
            what = f"{self.name} (pid {proc.pid}) exited with {code} after {time.monotonic() - self._started_at:.1f}s"
            if error is not None and time.monotonic() - self._started_at < 20:
                # The CLI refused to start (its one-paragraph error): a start-up that met a fault, not a crash.
                self.startup_failures.append(f"{what}: {error}")
                say(f"start-up failed: {what}: {error[:300]}; restarting")
            else:
                self.unexpected.append(f"{what}; last lines: {lines[-3:]}")
                say(f"UNEXPECTED: {what}; restarting (log {self.log_path})")
            delay = 0.5
        await asyncio.sleep(delay)
        if not self.stopping:
            await self.start()

    def signal(self, sig: int) -> bool:
        if self.proc is None or self.proc.returncode is not None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self, restart_after: float) -> bool:
        self._killed_by_us = True
        self._restart_after = restart_after
        return self.signal(signal.SIGKILL)

    async def stop(self, timeout: float = 15.0) -> None:
        self.stopping = True
        if self.frozen:
            self.signal(signal.SIGCONT)
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            await proc.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class RedisServer:
    """A private redis-server on a fixed port (kept across restarts), without persistence."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("chaos: redis-server is not installed (or pass --redis-url none)")
        self.proc = subprocess.Popen(
            [
                server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("chaos: the private redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


# -- the store, read directly by the monitor and the checker ----------------------------------------------------------
class StoreReader:
    """Read-only access to the run's store, outside Tenure (its connections are not `tenure-*`, so the
    terminations leave them alone)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith("postgres")
        self._conn: Any = None

    async def open(self) -> None:
        if self.pg:
            import asyncpg

            self._conn = await asyncpg.connect(self.url, server_settings={"application_name": "chaos-monitor"})

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def _sqlite(self, sql: str) -> list[tuple[Any, ...]]:
        path = self.url.removeprefix("sqlite:///")
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()

    async def fetch(self, pg_sql: str, sqlite_sql: str) -> list[tuple[Any, ...]]:
        if self.pg:
            return [tuple(r) for r in await self._conn.fetch(pg_sql)]
        return await asyncio.to_thread(self._sqlite, sqlite_sql)

    async def states(self) -> Counter[str]:
        rows = await self.fetch(
            "SELECT state, count(*) FROM jobs GROUP BY state", "SELECT state, count(*) FROM jobs GROUP BY state"
        )
        return Counter({s: int(c) for s, c in rows})

    async def workers_active(self) -> int:
        rows = await self.fetch(
            "SELECT count(*) FROM workers WHERE state = 'active'", "SELECT count(*) FROM workers WHERE state = 'active'"
        )
        return int(rows[0][0])

    async def jobs(self) -> list[tuple[Any, ...]]:
        return await self.fetch(
            "SELECT id::text, agent, state, epoch, execution_id::text, attempts, input::text, result::text,"
            " extract(epoch FROM created_at)::float8, extract(epoch FROM finished_at)::float8 FROM jobs",
            "SELECT id, agent, state, epoch, execution_id, attempts, input, result, created_at, finished_at FROM jobs",
        )

    async def executions(self) -> list[tuple[Any, ...]]:
        return await self.fetch(
            "SELECT id::text, job_id::text, epoch, outcome FROM executions",
            "SELECT id, job_id, epoch, outcome FROM executions",
        )

    async def events(self) -> list[tuple[Any, ...]]:
        return await self.fetch(
            "SELECT job_id::text, epoch, seq, execution_id::text, type, payload::text FROM events"
            " ORDER BY job_id, epoch, seq",
            "SELECT job_id, epoch, seq, execution_id, type, payload FROM events ORDER BY job_id, epoch, seq",
        )


# -- clients ----------------------------------------------------------------------------------------------------------
@dataclass
class Followed:
    job_id: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    done: bool = False
    note: str = ""


class Clients:
    """The run's HTTP side: submitters and SSE followers, spread over both gateways."""

    def __init__(self, seed: int, urls: list[str], deadline_s: float) -> None:
        self.seed = seed
        self.urls = urls
        self.deadline_s = deadline_s
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        timeout = httpx.Timeout(15.0, connect=3.0)
        self.http = [httpx.AsyncClient(base_url=u, limits=limits, timeout=timeout) for u in urls]
        self.ids: dict[int, str] = {}
        self.refused = Counter[str]()  # answers that made a submitter retry, by kind
        self.not_admitted: list[int] = []
        self.followed: list[Followed] = []
        self.follow_tasks: list[asyncio.Task[None]] = []
        self.follow_gate = asyncio.Semaphore(64)
        self.stop_following_at = float("inf")

    async def close(self) -> None:
        for c in self.http:
            await c.aclose()

    async def submit(self, i: int, agent: str, inp: dict[str, Any], give_up_at: float) -> str | None:
        body = {"agent": agent, "input": inp, "deadline_s": self.deadline_s}
        headers = {"Idempotency-Key": f"chaos-{self.seed}-{i}"}
        g = i % len(self.http)
        while time.monotonic() < give_up_at:
            try:
                r = await self.http[g].post("/v1/jobs", json=body, headers=headers)
            except httpx.HTTPError as exc:
                self.refused[type(exc).__name__] += 1
            else:
                if r.status_code in (200, 201):
                    return str(r.json()["id"])
                self.refused[str(r.status_code)] += 1
                if r.status_code == 429:
                    await asyncio.sleep(min(1.0, float(r.headers.get("retry-after", "1"))) * random.uniform(0.5, 1.0))
                    continue
                if r.status_code < 500:
                    raise RuntimeError(f"job {i}: the gateway refused the request: {r.status_code} {r.text[:300]}")
            g = (g + 1) % len(self.http)
            await asyncio.sleep(random.uniform(0.05, 0.25))
        return None

    def follow(self, i: int, job_id: str) -> None:
        f = Followed(job_id)
        self.followed.append(f)
        self.follow_tasks.append(asyncio.create_task(self._follow(f, random.Random(f"{self.seed}:follow:{i}"))))

    async def _follow(self, f: Followed, rng: random.Random) -> None:
        async with self.follow_gate:
            while time.monotonic() < self.stop_following_at:
                client = rng.choice(self.http)
                headers = {"Last-Event-ID": f.seen[-1]["id"]} if f.seen else {}
                # Disconnect after a few events (most connections), or read to the end.
                drop_after = rng.randint(1, 12) if rng.random() < 0.7 else None
                got = 0
                f.connections += 1
                try:
                    async with client.stream(
                        "GET", f"/v1/jobs/{f.job_id}/events", headers=headers, timeout=httpx.Timeout(30.0, connect=3.0)
                    ) as r:
                        if r.status_code == 204:
                            f.note = f"204 after {len(f.seen)} events"
                            return
                        if r.status_code != 200:
                            await asyncio.sleep(0.2)
                            continue
                        async for line in r.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            event = json.loads(line[5:])
                            f.seen.append(event)
                            got += 1
                            if event["type"] in TERMINAL_EVENTS:
                                f.done = True
                                return
                            if drop_after is not None and got >= drop_after:
                                break
                except (httpx.HTTPError, json.JSONDecodeError):
                    pass  # the gateway died, or the connection broke: resume from the cursor
                await asyncio.sleep(rng.uniform(0.0, 0.3))
            f.note = f"gave up after {len(f.seen)} events"


# -- the stale writer -------------------------------------------------------------------------------------------------
class Zombie:
    """A worker come back from the dead, on purpose: the freezes make real zombies, but a worker that fences itself
    in time (as it should) writes nothing stale, and then the store's own fences go untested. So this remembers the
    fences of running executions (read from the jobs table: job, epoch, token, execution, owner) and, once each has
    lost its job (its epoch moved on, its token changed, or it left `running`), replays through Tenure's Store API
    what that execution could still try: an event append (the next seq of its epoch) and a finish CAS. Every one
    must match nothing. `accepted` counts those the store took; the checker must find each of them in the store as
    a stale write too."""

    def __init__(self, database_url: str, reader: StoreReader, seed: int) -> None:
        self.url = database_url
        self.reader = reader
        self.rng = random.Random(f"{seed}:zombie")
        self.remembered: dict[str, tuple[int, int, str, str, float]] = {}  # job -> epoch, token, execution, owner, at
        self.attempted = 0
        self.accepted: list[str] = []
        self.failed = 0  # attempts the store could not answer (a terminated connection): not counted either way

    async def run(self, until: asyncio.Event) -> None:
        from tenure.app import open_backends
        from tenure.settings import Settings

        backends = await open_backends(Settings.of(database_url=self.url), migrate=False)
        try:
            while not until.is_set():
                await asyncio.sleep(0.5)
                with contextlib.suppress(Exception):
                    await self._remember()
                    await self._haunt(backends.jobs)
        finally:
            await backends.close()

    async def _remember(self) -> None:
        rows = await self.reader.fetch(
            "SELECT id::text, epoch, token, execution_id::text, owner FROM jobs WHERE state = 'running'"
            " ORDER BY random() LIMIT 4",
            "SELECT id, epoch, token, execution_id, owner FROM jobs WHERE state = 'running' ORDER BY random() LIMIT 4",
        )
        for job_id, epoch, token, execution_id, owner in rows:
            if len(self.remembered) < 40 and token is not None and execution_id is not None:
                self.remembered.setdefault(job_id, (int(epoch), int(token), execution_id, owner, time.monotonic()))

    async def _haunt(self, store: Any) -> None:
        from tenure.contracts.states import JobState
        from tenure.contracts.types import Fence, Finish, NewEvent

        for job_id, (epoch, token, execution_id, owner, at) in list(self.remembered.items()):
            if time.monotonic() - at < 1.0:
                continue
            now = await self.reader.fetch(
                f"SELECT state, epoch, token FROM jobs WHERE id = '{job_id}'",
                f"SELECT state, epoch, token FROM jobs WHERE id = '{job_id}'",
            )
            state, cur_epoch, cur_token = now[0]
            if state == "running" and int(cur_epoch) == epoch and cur_token is not None and int(cur_token) == token:
                if time.monotonic() - at > 30:
                    del self.remembered[job_id]
                continue  # still its job: nothing stale to try yet
            del self.remembered[job_id]
            last = await self.reader.fetch(
                f"SELECT coalesce(max(seq), 0) FROM events WHERE job_id = '{job_id}' AND epoch = {epoch}",
                f"SELECT coalesce(max(seq), 0) FROM events WHERE job_id = '{job_id}' AND epoch = {epoch}",
            )
            seq = int(last[0][0]) + 1
            fence = Fence(job_id, epoch, token)
            try:
                self.attempted += 1
                rejected = await store.append_events(
                    [NewEvent(fence, execution_id, seq, "zombie.append", json.dumps({"zombie": True}))]
                )
                if job_id not in rejected:
                    self.accepted.append(f"append of job {job_id} at {epoch}-{seq} (the job was {state})")
                self.attempted += 1
                finish = Finish(fence, execution_id, time.time(), JobState.SUCCEEDED, seq + 1, '{"zombie": true}')
                if job_id in await store.finish(owner or "zombie", [finish]):
                    self.accepted.append(f"finish of job {job_id} at epoch {epoch} (the job was {state})")
            except Exception:  # the store is under faults too: a failed attempt proves nothing either way
                self.failed += 1


# -- the run ----------------------------------------------------------------------------------------------------------
@dataclass
class Injected:
    counts: Counter[str] = field(default_factory=Counter)
    terminated_backends: int = 0
    log: list[str] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (seconds into the window, what began)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed: int = args.seed
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.effects = self.workdir / "effects"
        self.effects.mkdir(exist_ok=True)
        self.pg = bool(args.database_url) and args.database_url.startswith("postgres")
        self.admin_url: str | None = None
        self.database: str | None = None
        self.redis: RedisServer | None = None
        self.redis_url: str | None = None
        self.redis_owned = False
        self.procs: list[Managed] = []
        self.workers: list[Managed] = []
        self.gateways: list[Managed] = []
        self.mock: subprocess.Popen[str] | None = None
        self.mock_url = ""
        self.injected = Injected()

    # -- set-up ------------------------------------------------------------------------------------------------------
    async def _create_database(self) -> str:
        import asyncpg

        parts = urlsplit(self.args.database_url)
        self.admin_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        self.database = f"chaos_{self.seed}_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(self.admin_url, server_settings={"application_name": "chaos-admin"})
        try:
            await conn.execute(f"CREATE DATABASE {self.database}")
        finally:
            await conn.close()
        return urlunsplit((parts.scheme, parts.netloc, f"/{self.database}", "", ""))

    async def _drop_database(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url, server_settings={"application_name": "chaos-admin"})
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        finally:
            await conn.close()

    def _start_mock(self) -> None:
        self.mock = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "tenure.cli",
                "mock-model",
                "--port",
                "0",
                "--max-concurrency",
                str(MODEL_LIMIT),
                "--latency-ms",
                str(model_latency_ms(self.args.rate)),
                "--tokens",
                str(MODEL_TOKENS),
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.log_dir / "mock-model.log", "wb"),
            text=True,
            start_new_session=True,
            cwd=ROOT,
        )
        assert self.mock.stdout is not None
        line = self.mock.stdout.readline()
        if not line.startswith("mock model listening on http://"):
            raise SystemExit(f"chaos: the mock model did not start: {line!r}")
        self.mock_url = line.rsplit(" ", 1)[1].strip().rstrip("/")

    def _env(self, database_url: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        env.update(
            {
                "TENURE_DATABASE_URL": database_url,
                "TENURE_APP": "chaos_app:app",
                "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p),
                "TENURE_HEARTBEAT_S": str(HEARTBEAT_S),
                "TENURE_CLAIM_TTL_S": str(CLAIM_TTL_S),
                "TENURE_SWEEP_INTERVAL_S": str(SWEEP_S),
                "TENURE_POLL_S": "0.25",
                "TENURE_DRAIN_TIMEOUT_S": "5",
                "TENURE_QUOTAS": f"llm:mock={QUOTA}",
                "TENURE_MODEL_URL": self.mock_url + "/v1",
                "TENURE_LOG_LEVEL": "info",
                "TENURE_LOG_FORMAT": "console",
                "TENURE_MAX_QUEUED": "2000",
                "TENURE_MAX_QUEUED_PER_TENANT": "2000",
                "CHAOS_EFFECTS_DIR": str(self.effects),
            }
        )
        if self.redis_url:
            env["TENURE_REDIS_URL"] = self.redis_url
            env["TENURE_REDIS_PREFIX"] = f"chaos-{self.seed}:"
        return env

    async def setup(self) -> str:
        args = self.args
        if self.pg:
            database_url = await self._create_database()
            if args.redis_url in (None, "", "private"):
                self.redis = RedisServer(self.workdir)
                self.redis.start()
                self.redis_url = self.redis.url
                self.redis_owned = True
            elif args.redis_url != "none":
                self.redis_url = args.redis_url
        else:
            database_url = f"sqlite:///{self.workdir}/tenure.db"
            if args.redis_url not in (None, "", "none", "private"):
                self.redis_url = args.redis_url
        self._start_mock()
        env = self._env(database_url)
        subprocess.run([PYTHON, "-m", "tenure.cli", "migrate"], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        ports = [free_port() for _ in range(GATEWAYS)]
        self.gateway_urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, port in enumerate(ports):
            m = Managed(f"gateway-{i}", [PYTHON, "-m", "tenure.cli", "gateway", "--port", str(port)], env, self.log_dir)
            self.gateways.append(m)
        for i in range(WORKERS):
            argv = [PYTHON, "-m", "tenure.cli", "worker", "--concurrency", str(args.concurrency)]
            self.workers.append(Managed(f"worker-{i}", argv, env, self.log_dir))
        self.procs = self.gateways + self.workers
        for m in self.procs:
            await m.start()
        return database_url

    async def wait_ready(self, reader: StoreReader) -> None:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                ok = 0
                for u in self.gateway_urls:
                    with contextlib.suppress(httpx.HTTPError):
                        ok += (await http.get(u + "/readyz")).status_code == 200
                if ok == GATEWAYS and await reader.workers_active() >= WORKERS:
                    return
                await asyncio.sleep(0.2)
        raise SystemExit(f"chaos: the fleet did not come up within 60 s (logs in {self.log_dir})")

    # -- faults ------------------------------------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        kinds = ["worker_kill", "worker_stop"]
        if self.redis_url:
            kinds += ["redis_restart", "redis_flushall"]
        if self.pg:
            kinds.append("pg_terminate")
        kinds.append("gateway_kill")
        return kinds

    async def _redis_call(self, *command: str) -> None:
        import redis.asyncio as aioredis

        client = aioredis.from_url(self.redis_url)
        try:
            await client.execute_command(*command)
        finally:
            await client.aclose()

    async def _terminate_backends(self) -> int:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url, server_settings={"application_name": "chaos-admin"})
        try:
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND application_name LIKE 'tenure-%' AND pid <> pg_backend_pid()",
                self.database,
            )
        finally:
            await conn.close()
        return len(rows)

    async def inject(self, fault: Fault, t0: float) -> None:
        note = ""
        self.injected.timeline.append((time.monotonic() - t0, fault.describe()))
        if fault.kind == "worker_kill":
            assert fault.target is not None
            self.workers[fault.target].kill(fault.duration_s)
        elif fault.kind == "worker_stop":
            assert fault.target is not None
            w = self.workers[fault.target]
            if w.signal(signal.SIGSTOP):
                w.frozen = True
                await asyncio.sleep(fault.duration_s)
                w.signal(signal.SIGCONT)
                w.frozen = False
            else:
                note = " (the process was not running)"
        elif fault.kind == "gateway_kill":
            assert fault.target is not None
            self.gateways[fault.target].kill(fault.duration_s)
        elif fault.kind == "redis_flushall":
            try:
                await self._redis_call("FLUSHALL")
            except Exception as exc:
                note = f" (failed: {exc})"
        elif fault.kind == "redis_restart":
            if self.redis is not None:
                await asyncio.to_thread(self.redis.kill)
                await asyncio.sleep(fault.duration_s)
                await asyncio.to_thread(self.redis.start)
            else:  # a Redis given by URL: what a restart without persistence looks like to its clients
                with contextlib.suppress(Exception):
                    await self._redis_call("CLIENT", "KILL", "TYPE", "normal")
                with contextlib.suppress(Exception):
                    await self._redis_call("CLIENT", "KILL", "TYPE", "pubsub")
                await asyncio.sleep(fault.duration_s)
                await self._redis_call("FLUSHALL")
        elif fault.kind == "pg_terminate":
            n = await self._terminate_backends()
            self.injected.terminated_backends += n
            note = f" ({n} backends)"
        self.injected.counts[fault.kind] += 1
        self.injected.log.append(fault.describe() + note)

    async def run_faults(self, plan: list[Fault], t0: float) -> None:
        running: list[asyncio.Task[None]] = []
        for fault in plan:
            await asyncio.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            running.append(asyncio.create_task(self.inject(fault, t0)))
        await asyncio.gather(*running)
        # The faults have stopped once every killed process is back.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            m.proc is not None and m.proc.returncode is None and not m.frozen for m in self.procs
        ):
            await asyncio.sleep(0.1)
        if self.redis is not None and self.redis.proc is None:
            await asyncio.to_thread(self.redis.start)

    # -- tear-down ---------------------------------------------------------------------------------------------------
    async def teardown(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.procs), return_exceptions=True)
        if self.mock is not None and self.mock.poll() is None:
            self.mock.terminate()
            try:
                self.mock.wait(10)
            except subprocess.TimeoutExpired:
                self.mock.kill()
        if self.redis is not None:
            self.redis.kill()
        if self.database and not self.args.keep:
            with contextlib.suppress(Exception):
                await self._drop_database()

    async def mock_stats(self) -> dict[str, int]:
        async with httpx.AsyncClient(timeout=5) as http:
            return dict((await http.get(self.mock_url + "/stats")).json())

    async def sample_mock(self, t0: float, overruns: list[str]) -> None:
        """Poll the mock's counters: each moment its in-flight count passes the quota is evidence, with the faults
        injected in the seconds before it (the counters themselves keep only the peak)."""
        peak = 0
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    stats = (await http.get(self.mock_url + "/stats")).json()
                    now = time.monotonic() - t0
                    if stats["in_flight"] > QUOTA or stats["max_in_flight"] > max(peak, QUOTA):
                        recent = [f for t, f in self.injected.timeline if now - 8 <= t <= now]
                        overruns.append(
                            f"quota overrun at +{now:.2f}s: in flight {stats['in_flight']}, peak {stats['max_in_flight']}"
                            f" (quota {QUOTA}); faults in the 8 s before: {recent}"
                        )
                    peak = max(peak, stats["max_in_flight"])
                await asyncio.sleep(0.02)


# -- the checker ------------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    jobs: int
    faults: int
    nonterminal: int = 0
    double_effects: int = 0
    stale_writes: int = 0
    quota_over: int = 0
    r429: int = 0
    stream_mismatch: int = 0
    jobs_per_s: float = 0.0

    def line(self) -> str:
        return (
            f"jobs={self.jobs} faults={self.faults} nonterminal={self.nonterminal} double_effects={self.double_effects}"
            f" stale_writes={self.stale_writes} quota_over={self.quota_over} r429={self.r429}"
            f" stream_mismatch={self.stream_mismatch} jobs_per_s={self.jobs_per_s:.1f}"
        )

    def clean(self) -> bool:
        return not (
            self.nonterminal
            or self.double_effects
            or self.stale_writes
            or self.quota_over
            or self.r429
            or self.stream_mismatch
        )


@dataclass
class Checks:
    admitted: int = 0
    not_admitted: int = 0
    store_jobs: int = 0
    duplicate_jobs: int = 0
    history_gaps: int = 0
    unrecorded: int = 0
    result_mismatch: int = 0
    effects_missing: int = 0
    unexpected_exits: int = 0
    zombie_effects: int = 0  # informational: effects of lost jobs performed after they were declared lost
    startup_failures: int = 0  # informational: processes that refused to start (the CLI's error) during a fault
    zombie_writes: int = 0  # informational: stale writes the deliberate zombie attempted
    zombie_accepted: int = 0  # of which the store accepted (each must also be one of the verdict's stale_writes)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())

    def clean(self) -> bool:
        return not (
            self.not_admitted
            or self.duplicate_jobs
            or self.history_gaps
            or self.unrecorded
            or self.result_mismatch
            or self.effects_missing
            or self.unexpected_exits
            or self.zombie_accepted
        )


def _loads(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else text


def check_store(
    jobs: list[tuple[Any, ...]],
    executions: list[tuple[Any, ...]],
    events: list[tuple[Any, ...]],
    effects: dict[str, list[str]],
    verdict: Verdict,
    checks: Checks,
    evidence: list[str],
) -> dict[str, list[tuple[int, int, str, Any]]]:
    """Every check that reads the store and the counter files (see the module docstring). Returns each job's
    history as (epoch, seq, type, payload), for the stream comparison."""
    ex_by_job: dict[str, dict[int, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    ex_ids: dict[str, set[str]] = defaultdict(set)
    for ex_id, job_id, epoch, outcome in executions:
        ex_by_job[job_id][int(epoch)].append((ex_id, outcome))
        ex_ids[job_id].add(ex_id)
    ev_by_job: dict[str, dict[int, list[tuple[int, str | None, str, Any]]]] = defaultdict(lambda: defaultdict(list))
    history: dict[str, list[tuple[int, int, str, Any]]] = defaultdict(list)
    for job_id, epoch, seq, ex_id, type_, payload in events:
        p = _loads(payload)
        ev_by_job[job_id][int(epoch)].append((int(seq), ex_id, type_, p))
        history[job_id].append((int(epoch), int(seq), type_, p))

    def stale(job_id: str, why: str, n: int = 1) -> None:
        verdict.stale_writes += n
        evidence.append(f"stale write: job {job_id}: {why}")

    for job_id, agent, state, epoch, execution_id, attempts, input_text, result_text, _c, finished in jobs:
        epoch = int(epoch)
        if state not in TERMINAL:
            verdict.nonterminal += 1
            evidence.append(f"nonterminal: job {job_id} ({agent}) is {state} at epoch {epoch}")
        recorded = ex_by_job.get(job_id, {})
        for e, rows in recorded.items():
            if len(rows) > 1:
                stale(job_id, f"{len(rows)} executions recorded for epoch {e}: {rows}", len(rows) - 1)
            if e > epoch:
                stale(job_id, f"an execution recorded for epoch {e}, past the job's epoch {epoch}")
        succeeded = [(e, x) for e, rows in recorded.items() for x, o in rows if o == "succeeded"]
        if len(succeeded) > 1 or (succeeded and (state != "succeeded" or succeeded[0][0] != epoch)):
            stale(job_id, f"succeeded executions {succeeded} for a job {state} at epoch {epoch}")
        by_epoch = ev_by_job.get(job_id, {})
        for e, evs in by_epoch.items():
            seqs = [s for s, _x, _t, _p in evs]
            if seqs != list(range(1, len(seqs) + 1)):
                checks.history_gaps += 1
                evidence.append(f"history gap: job {job_id} epoch {e}: seqs {seqs}")
            rows = recorded.get(e, [])
            owner = rows[0][0] if rows else (execution_id if e == epoch else None)
            named = {x for _s, x, _t, _p in evs if x is not None}
            if owner is None and named:
                if state in TERMINAL or e != epoch:
                    checks.unrecorded += 1
                    evidence.append(f"unrecorded execution: job {job_id} epoch {e}: events of {sorted(named)}")
                owner = sorted(named)[0]
            # Each offending event counts once, whichever rules it breaks.
            offending: dict[int, str] = {}
            for s, x, t, _p in evs:
                if x is not None and x != owner:
                    offending[s] = f"{t} of execution {x}, not the epoch's {owner}"
            closers = [(s, t) for s, _x, t, _p in evs if t in CLOSING_EVENTS]
            # An execution's own close (retrying, or lost and requeued) leaves the job unowned in the same epoch until
            # the next claim: the job's own end meanwhile (expired past its queue deadline, cancelled), written by the
            # store with no execution, may follow it, as the epoch's last event.
            ends = {s for s, x, t, _p in evs if x is None and t in TERMINAL_EVENTS}
            if len(closers) > 1 and closers[0][1] in EXECUTION_CLOSES and closers[1][0] in ends:
                job_end: int | None = closers[1][0]
            else:
                job_end = None
            for s, t in closers[1:]:
                if s != job_end:
                    offending.setdefault(s, f"{t}, a second close after {closers[0]}")
            if closers:
                for s, _x, t, _p in evs:
                    if s > closers[0][0] and s != job_end:
                        offending.setdefault(s, f"{t}, after the close {closers[0]}")
            if offending:
                shown = sorted(offending.items())[:3]
                stale(job_id, f"epoch {e}: {len(offending)} events written past the fence: {shown}", len(offending))
        if state in TERMINAL and execution_id is not None:
            rows = recorded.get(epoch, [])
            if not rows:
                checks.unrecorded += 1
                evidence.append(f"unrecorded execution: job {job_id} is {state} by {execution_id} at epoch {epoch}")
            elif rows[0][0] != execution_id:
                stale(job_id, f"finished by {execution_id} at epoch {epoch}, whose recorded execution is {rows[0][0]}")
            last = by_epoch.get(epoch, [])
            last_type = last[-1][2] if last else None
            closing = [t for _s, _x, t, _p in last if t in CLOSING_EVENTS]
            if closing and closing[0] != f"job.{state}":
                stale(job_id, f"is {state}, yet its epoch {epoch} was closed by {closing[0]} (last event {last_type})")
        if state in TERMINAL and sum(len(r) for r in recorded.values()) != int(attempts):
            checks.unrecorded += 1
            evidence.append(f"unrecorded execution: job {job_id}: {attempts} attempts, {dict(recorded)} recorded")

        # The result against the input and the final epoch's events.
        inp = _loads(input_text)
        lines = effects.get(job_id, [])
        if agent == "effect":
            if len(lines) > 1:
                verdict.double_effects += 1
                evidence.append(f"double effect: job {job_id} ({state}): {lines}")
            if state == "succeeded" and not lines:
                checks.effects_missing += 1
                evidence.append(f"effect missing: job {job_id} succeeded without its effect")
            for line in lines:
                if line.split(" ", 1)[0] not in ex_ids.get(job_id, set()) | {execution_id}:
                    stale(job_id, f"effect by an execution the store does not know: {line}")
                if state == "lost" and finished is not None and float(line.rsplit(" ", 1)[1]) > float(finished):
                    # Not a violation (a lost job's effect may have happened), but worth knowing: the effect ran
                    # after the sweeper had declared the job lost, i.e. in a resumed zombie.
                    checks.zombie_effects += 1
                    evidence.append(f"zombie effect: job {job_id} declared lost at {finished}, effect at {line}")
        if state != "succeeded":
            continue
        result = _loads(result_text)
        final = by_epoch.get(epoch, [])
        ok = True
        if agent == "safe":
            progress = [p["i"] for _s, _x, t, p in final if t == "progress"]
            ok = result == {"n": inp["n"], "steps": inp["steps"]} and progress == list(range(inp["steps"]))
        elif agent == "stream":
            ticks = [p["i"] for _s, _x, t, p in final if t == "tick"]
            ok = result == {"n": inp["n"], "count": inp["count"]} and ticks == list(range(inp["count"]))
        elif agent == "chat":
            text = "".join(p["text"] for _s, _x, t, p in final if t == "message.delta")
            expected = expected_chat_text(inp["prompt"], inp["max_tokens"])
            ok = result.get("text") == expected == text
        elif agent == "effect":
            ok = result == {"n": inp["n"], "effect": True} and len(lines) == 1
        if not ok:
            checks.result_mismatch += 1
            evidence.append(f"result mismatch: job {job_id} ({agent}) result {result} for input {inp}")
    return history


def compare_streams(
    followed: list[Followed], history: dict[str, list[tuple[int, int, str, Any]]], evidence: list[str]
) -> int:
    mismatched = 0
    for f in followed:
        seen = [(int(e["epoch"]), int(e["seq"]), e["type"], e["payload"]) for e in f.seen]
        truth = history.get(f.job_id, [])
        if f.done and seen == truth:
            continue
        mismatched += 1
        diverge = next((k for k, (a, b) in enumerate(zip(seen, truth, strict=False)) if a != b), min(len(seen), len(truth)))
        evidence.append(
            f"stream mismatch: job {f.job_id}: {len(seen)} seen over {f.connections} connections, {len(truth)} in"
            f" history, first difference at #{diverge}: seen {seen[diverge : diverge + 2]} history"
            f" {truth[diverge : diverge + 2]} {f.note}"
        )
    return mismatched


def read_effects(directory: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in directory.iterdir():
        out[path.name] = [line for line in path.read_text().splitlines() if line]
    return out


def count_in_logs(procs: list[Managed], needles: Iterable[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for m in procs:
        text = m.log_text()
        for n in needles:
            found[n] += text.count(n)
    return found


# -- main -------------------------------------------------------------------------------------------------------------
async def main_async(args: argparse.Namespace) -> int:
    run = Run(args)
    window_s = args.jobs / args.rate
    say(
        f"seed={args.seed} jobs={args.jobs} store={'postgresql' if run.pg else 'sqlite'} workers={WORKERS}"
        f" gateways={GATEWAYS} rate={args.rate:g}/s window={window_s:.0f}s workdir={run.workdir}"
    )
    verdict: Verdict | None = None
    checks = Checks()
    evidence: list[str] = []
    result: dict[str, Any] = {}
    reader: StoreReader | None = None
    clients: Clients | None = None
    try:
        database_url = await run.setup()
        kinds = run.kinds()
        plan = plan_faults(args.seed, kinds, window_s, args.faults_per_kind, WORKERS, GATEWAYS, CLAIM_TTL_S)
        planned = Counter(f.kind for f in plan)
        say(
            f"redis={'private' if run.redis_owned else (run.redis_url or 'none')} fault plan: {len(plan)} faults "
            + " ".join(f"{k}={planned[k]}" for k in kinds)
        )
        for f in plan:
            say("  plan " + f.describe())
        reader = StoreReader(database_url)
        await reader.open()
        await run.wait_ready(reader)
        jobs = plan_jobs(args.seed, args.jobs)
        clients = Clients(args.seed, run.gateway_urls, args.deadline_s)

        t0 = time.monotonic()
        faults = asyncio.create_task(run.run_faults(plan, t0))
        submit_gate = asyncio.Semaphore(32)
        give_up_at = t0 + window_s + args.deadline_s

        async def submit_one(i: int) -> None:
            try:
                agent, inp, followed = jobs[i]
                job_id = await clients.submit(i, agent, inp, give_up_at)
                if job_id is None:
                    clients.not_admitted.append(i)
                    return
                clients.ids[i] = job_id
                if followed:
                    clients.follow(i, job_id)
            finally:
                submit_gate.release()

        async def progress() -> None:
            while True:
                await asyncio.sleep(10)
                states = await reader.states()
                done = sum(c for s, c in states.items() if s in TERMINAL)
                say(
                    f"  t={time.monotonic() - t0:6.1f}s admitted={len(clients.ids)} terminal={done}"
                    f" live={ {s: c for s, c in states.items() if s not in TERMINAL} }"
                    f" faults={sum(run.injected.counts.values())}"
                )

        monitor = asyncio.create_task(progress())
        zombie = Zombie(database_url, reader, args.seed)
        haunting = asyncio.Event()
        zombie_task = asyncio.create_task(zombie.run(haunting))
        overruns: list[str] = []
        sampler = asyncio.create_task(run.sample_mock(t0, overruns))
        submitters = []
        for i in range(args.jobs):
            await asyncio.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
            await submit_gate.acquire()
            submitters.append(asyncio.create_task(submit_one(i)))
        await asyncio.gather(*submitters)
        submit_end = time.monotonic()
        await faults
        haunting.set()
        await zombie_task
        faults_end = time.monotonic()
        say(
            f"admission done at +{submit_end - t0:.1f}s, faults done at +{faults_end - t0:.1f}s: "
            + " ".join(f"{k}={run.injected.counts[k]}" for k in kinds)
        )

        # The bounds: a job not started within its queue deadline expires; a started one ends within the agent's
        # timeout, or its claim expires (TTL) and the sweeper ends it; then one more sweep.
        bound_s = args.deadline_s + AGENT_TIMEOUT_S + CLAIM_TTL_S + 2 * SWEEP_S + 10
        bound_at = max(submit_end, faults_end) + bound_s
        clients.stop_following_at = bound_at
        while time.monotonic() < bound_at:
            states = await reader.states()
            if sum(c for s, c in states.items() if s not in TERMINAL) == 0 and all(t.done() for t in clients.follow_tasks):
                break
            await asyncio.sleep(0.5)
        drained = time.monotonic()
        monitor.cancel()
        sampler.cancel()
        await asyncio.gather(*clients.follow_tasks, return_exceptions=True)
        say(f"drained {drained - max(submit_end, faults_end):.1f}s after the faults stopped (bound {bound_s:.0f}s)")

        # The checker.
        stats = await run.mock_stats()
        job_rows, ex_rows, ev_rows = await reader.jobs(), await reader.executions(), await reader.events()
        effects = await asyncio.to_thread(read_effects, run.effects)
        verdict = Verdict(jobs=args.jobs, faults=sum(run.injected.counts.values()))
        history = check_store(job_rows, ex_rows, ev_rows, effects, verdict, checks, evidence)
        evidence[:0] = overruns
        verdict.stream_mismatch = compare_streams(clients.followed, history, evidence)
        verdict.quota_over = max(0, int(stats["max_in_flight"]) - QUOTA)
        verdict.r429 = int(stats["rejected_429"])
        terminal = [r for r in job_rows if r[2] in TERMINAL and r[9] is not None]
        if terminal:
            span = max(float(r[9]) for r in terminal) - min(float(r[8]) for r in job_rows)
            verdict.jobs_per_s = len(terminal) / span if span > 0 else 0.0
        checks.admitted = len(clients.ids)
        checks.not_admitted = len(clients.not_admitted)
        checks.store_jobs = len(job_rows)
        checks.duplicate_jobs = len(job_rows) - len(set(clients.ids.values()))
        checks.unexpected_exits = sum(len(m.unexpected) for m in run.procs)
        checks.startup_failures = sum(len(m.startup_failures) for m in run.procs)
        checks.zombie_writes = zombie.attempted
        checks.zombie_accepted = len(zombie.accepted)
        evidence.extend(f"zombie write accepted: {z}" for z in zombie.accepted)
        evidence.extend(f"unexpected exit: {u}" for m in run.procs for u in m.unexpected)
        evidence.extend(f"start-up failure: {u}" for m in run.procs for u in m.startup_failures)

        outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        for r in job_rows:
            outcomes[r[1]][r[2]] += 1
        attempts = Counter(int(r[5]) for r in job_rows)
        say(
            "outcomes: "
            + "; ".join(f"{a}: " + " ".join(f"{s}={c}" for s, c in sorted(o.items())) for a, o in sorted(outcomes.items()))
        )
        say(f"attempts per job: {dict(sorted(attempts.items()))}; mock model: {stats} (quota {QUOTA}, limit {MODEL_LIMIT})")
        fenced = count_in_logs(run.workers, ("ownership lost (epoch", "finish not recorded", "ready index rebuilt"))
        say(
            f"followed streams={len(clients.followed)} connections={sum(f.connections for f in clients.followed)}"
            f" events seen={sum(len(f.seen) for f in clients.followed)}; submit retries={dict(clients.refused)}"
        )
        say(
            "faults injected: "
            + " ".join(f"{k}={run.injected.counts[k]}" for k in kinds)
            + (f" (backends terminated: {run.injected.terminated_backends})" if run.pg else "")
            + f"; workers' logs: executions stopped on ownership lost={fenced['ownership lost (epoch']}"
            f" finishes refused={fenced['finish not recorded']} ready index rebuilt={fenced['ready index rebuilt']}"
        )
        say(
            f"timing: admission {submit_end - t0:.1f}s, faults {faults_end - t0:.1f}s, drain after faults"
            f" {drained - max(submit_end, faults_end):.1f}s, run {drained - t0:.1f}s"
        )
        for line in evidence[:40]:
            say("  " + line)
        if len(evidence) > 40:
            say(f"  ... {len(evidence) - 40} more lines of evidence in {run.workdir / 'chaos.json'}")
        say("checks: " + checks.line())
        result = {
            "seed": args.seed,
            "verdict": asdict(verdict),
            "checks": asdict(checks),
            "outcomes": {a: dict(o) for a, o in outcomes.items()},
            "mock": stats,
            "faults": sorted(run.injected.log),  # "+  12.34s kind ...": fixed width, so in time order
            "evidence": evidence,
            "timing": {"admission_s": submit_end - t0, "faults_s": faults_end - t0, "run_s": drained - t0},
        }
    finally:
        if clients is not None:
            for t in clients.follow_tasks:
                t.cancel()
            await clients.close()
        if reader is not None:
            await reader.close()
        await run.teardown()
    (run.workdir / "chaos.json").write_text(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    assert verdict is not None
    ok = verdict.clean() and checks.clean()
    if ok and not args.keep:
        shutil.rmtree(run.workdir, ignore_errors=True)
    elif not ok:
        say(f"logs and evidence kept in {run.workdir}")
    say(verdict.line())
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="full",
        help="full: 10,000 jobs at 40/s, 5 faults per kind at least; bounded (make test): 1,000 at 25/s, 2 per kind."
        " The flags below override it",
    )
    p.add_argument("--jobs", type=int)
    p.add_argument("--seed", type=int, default=None, help="replays the same fault schedule and job mix (default: random)")
    p.add_argument("--database-url", help="a PostgreSQL server to create the run's database on (default: SQLite)")
    p.add_argument("--redis-url", help="'none', or a Redis this run may flush (default on PostgreSQL: a private one)")
    p.add_argument("--rate", type=float, help="jobs admitted per second (the window is jobs / rate)")
    p.add_argument("--faults-per-kind", type=int)
    p.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    p.add_argument("--deadline-s", type=float, help="queue deadline of every job")
    p.add_argument("--workdir", help="where logs, effects and the SQLite file go (default: a temporary directory)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--keep", action="store_true", help="keep the work directory and the PostgreSQL database")
    p.add_argument("--plan-only", action="store_true", help="print the fault schedule for the seed and stop")
    args = p.parse_args(argv)
    for name, value in PROFILES[args.profile].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    if args.plan_only:
        pg = bool(args.database_url) and args.database_url.startswith("postgres")
        redis = (pg and args.redis_url != "none") or (not pg and args.redis_url not in (None, "none", "private"))
        kinds = [
            k
            for k in ALL_KINDS
            if (k.startswith("redis") and redis)
            or (k == "pg_terminate" and pg)
            or k in ("worker_kill", "worker_stop", "gateway_kill")
        ]
        plan = plan_faults(args.seed, kinds, args.jobs / args.rate, args.faults_per_kind, WORKERS, GATEWAYS, CLAIM_TTL_S)
        say(f"seed={args.seed} {len(plan)} faults: " + " ".join(f"{k}={sum(f.kind == k for f in plan)}" for k in kinds))
        for f in plan:
            say("  plan " + f.describe())
        return 0
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
