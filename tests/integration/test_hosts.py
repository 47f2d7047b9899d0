"""Hosts of their own (issue 16): every gateway and worker in a Linux network namespace of its own, PostgreSQL
and Redis reached over a bridge (tests/integration/netns.py has the layout), links cut and partitions made by
the test itself.

- a worker host's link cut mid-job: its pre-start claim is released and run elsewhere (epoch + 1), its started
  jobs end `lost` or, retry-safe, run again elsewhere; when the link returns its late writes match nothing;
- a gateway host cut off: SSE and WebSocket clients reconnect to the other gateway with their cursor and receive
  the rest of the history, no gap, no duplicate;
- a worker partitioned from Redis only: it keeps claiming and finishing through PostgreSQL, a fail-closed quota
  refuses with `QuotaUnavailable`, a fail-open one lets its jobs through.

Each test owns its network, its database (CREATE DATABASE / DROP ... WITH (FORCE)) and its redis-server, and
removes every namespace and link it made in teardown, also when it fails.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest
import websockets

from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import Job
from tenure.local import LocalClient, connect
from tenure.settings import Settings
from tests.conftest import PG_BASE
from tests.integration import netns
from tests.integration.netns import GatewayProc, Host, Network, TcpForwarder
from tests.integration.procs import FAST, SWEEP, TTL, TenureProc, WorkerProc, eventually
from tests.integration.redisproc import RedisProc

pytestmark = pytest.mark.slow

APP = "tests.integration.hosts_app:app"
T = TypeVar("T")


async def submit_id(client: LocalClient, agent: str, input: object) -> str:
    """Admit a job through the store and answer its id."""
    return (await client.submit(agent, input)).job.id


# -- the site: a network, PostgreSQL over the bridge, the processes on its hosts ------------------------------------
@dataclass
class Site:
    """One test's network and services. `url` is the database for the test process (loopback); `host_url` the
    same database for the hosts, through the forwarder on the bridge."""

    network: Network
    forwarder: TcpForwarder
    database: str
    url: str
    host_url: str
    log_dir: Path
    procs: list[TenureProc] = field(default_factory=list)

    def worker(self, host: Host, name: str, *, concurrency: int = 1, env: dict[str, str] | None = None,
               args: tuple[str, ...] = ()) -> WorkerProc:  # fmt: skip
        w = WorkerProc(self.host_url, self.log_dir, name, concurrency=concurrency, env=env, app=APP, args=args,
                       wrap=host.wrap)  # fmt: skip
        self.procs.append(w)
        return w

    def gateway(self, host: Host, name: str, env: dict[str, str] | None = None) -> GatewayProc:
        g = GatewayProc(host, self.host_url, self.log_dir, name, app=APP, env=(env or {}) | GATEWAY_KEYS)
        self.procs.append(g)
        return g

    def logs(self) -> str:
        """Every process's log, for a failure message."""
        return "\n".join(f"----- {p.name} (pid {p.pid}) -----\n{p.log()[-6000:]}" for p in self.procs)


API_KEY = "hosts-key-0123456789"
GATEWAY_KEYS = {"TENURE_API_KEYS": f"tenant-a:{API_KEY}"}


def _database_url(base: str, database: str, host: str | None = None, port: int | None = None) -> str:
    parts = urllib.parse.urlsplit(base)
    netloc = parts.netloc
    if host is not None:
        user = netloc.rsplit("@", 1)[0] + "@" if "@" in netloc else ""
        netloc = f"{user}{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, "/" + database, "", ""))


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    """A network (bridge + hosts added by the test), a database of the test's own, and a forwarder on the
    bridge to the system PostgreSQL. Teardown, in order and whatever happened: SIGKILL the processes, drop
    the database, stop the forwarder, remove every namespace and link (and fail if any is left)."""
    network = Network()
    procs: list[TenureProc] = []
    try:
        pg = urllib.parse.urlsplit(PG_BASE)
        forwarder = TcpForwarder(network.gateway, (pg.hostname or "127.0.0.1", pg.port or 5432))
        try:
            database = "t_hosts_" + uuid.uuid4().hex[:10]
            conn = await asyncpg.connect(PG_BASE)
            try:
                await conn.execute(f"CREATE DATABASE {database}")
            finally:
                await conn.close()
            try:
                with netns.stopping(procs):
                    yield Site(
                        network,
                        forwarder,
                        database,
                        _database_url(PG_BASE, database),
                        _database_url(PG_BASE, database, network.gateway, forwarder.port),
                        tmp_path,
                        procs,
                    )
            finally:
                conn = await asyncpg.connect(PG_BASE)
                try:
                    await conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
                finally:
                    await conn.close()
        finally:
            forwarder.close()
    finally:
        network.close()


# -- helpers ---------------------------------------------------------------------------------------------------------
def _of(worker: TenureProc, job: Job | None) -> bool:
    return job is not None and job.owner is not None and f":{worker.pid}:" in job.owner


async def _job_where(client: LocalClient, job_id: str, ok: Callable[[Job], bool]) -> Job | None:
    job = await client.job(job_id)
    return job if ok(job) else None


def _marks(path: Path) -> list[tuple[str, int, int, float]]:
    """The `ticker` marks: (execution id, epoch, n, time) per tick that ran."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        execution, epoch, n, ts = line.split()
        out.append((execution, int(epoch), int(n), float(ts)))
    return out


def _row(job: Job) -> dict[str, Any]:
    """What a late write could change in a job row."""
    return {
        k: getattr(job, k)
        for k in ("state", "owner", "epoch", "execution_id", "attempts", "result", "error_code", "error_message",
                  "claimed_at", "claim_expires_at", "execution_started_at", "next_attempt_at", "finished_at")
    }  # fmt: skip


async def _history(client: LocalClient, job_id: str) -> list[tuple[int, int, str | None, str, str]]:
    return [
        (e.epoch, e.seq, e.execution_id, e.type, json.dumps(e.payload, sort_keys=True)) for e in await client.events(job_id)
    ]


async def _registered(client: LocalClient, worker: TenureProc) -> bool:
    return any(f":{worker.pid}:" in w.id and w.state is WorkerState.ACTIVE for w in await client.workers())


async def _within(what: str, within_s: float, check: Callable[[], Awaitable[T | None]], site: Site) -> T:
    return await eventually(check, within_s, f"{what}\n{site.logs()}")


# -- the network itself ------------------------------------------------------------------------------------------
def test_a_network_is_removed_with_its_processes_even_when_the_test_body_fails() -> None:
    net = Network()
    host = net.add_host("h")
    sleeper = subprocess.Popen([*host.wrap, "sleep", "300"])
    assert set(net.remaining()) == {host.ns, host.veth, net.bridge}
    with pytest.raises(RuntimeError, match="the scenario failed"), net:
        raise RuntimeError("the scenario failed")
    assert sleeper.wait(5) == -9  # killed by the teardown, or the namespace (and its veth) would live on
    assert net.remaining() == []
    net.close()  # idempotent
    assert not (netns.REGISTRY / net.run_id).exists()


def test_leftovers_of_a_run_whose_owner_died_are_removed_by_the_next_run() -> None:
    crashed = Network()
    host = crashed.add_host("h")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (netns.REGISTRY / crashed.run_id).write_text(json.dumps({"pid": dead.pid, "start": "0"}))
    alive = Network()  # sweeps at start: the crashed run's owner is dead
    try:
        assert {host.ns, host.veth, crashed.bridge} <= set(alive.swept)
        assert crashed.remaining() == [] and not (netns.REGISTRY / crashed.run_id).exists()
        assert alive.remaining() == [alive.bridge]  # a live run's network is never swept
    finally:
        alive.close()
        crashed.close()


# -- 1. a worker host's link cut mid-job ---------------------------------------------------------------------------
PARK_S = 15.0  # how long worker A holds its pre-start claim (TENURE_FAULTS=after_claim@echo=sleep:N)


async def test_a_worker_host_cut_off_mid_job_loses_every_job_to_another_host_and_its_late_writes_match_nothing(
    site: Site, tmp_path: Path
) -> None:
    """Worker A holds three jobs when its cable is pulled: P claimed but not started (parked by a fault), N
    started and not retry-safe, R started and retry-safe. Worker B, on another host, gets P (epoch 2) and R
    (epoch 2, a new execution) and runs them; N ends `lost`. A stops its own executions once no heartbeat got
    through for a claim TTL. When the cable is back, A's writes still pending (the ticks of R and N, the finish
    of N, which returned during the cut) and its parked start of P reach the database and match nothing: the
    job rows and histories are exactly what they were while A was away."""
    net = site.network
    host_a, host_b = net.add_host("worker-a"), net.add_host("worker-b")
    marks_r, marks_n, release_n = tmp_path / "r.marks", tmp_path / "n.marks", tmp_path / "release-n"
    a = site.worker(
        host_a,
        "worker-a",
        concurrency=3,
        env={"TENURE_CLAIM_MODE": "two_step", "TENURE_FAULTS": f"after_claim@echo=sleep:{PARK_S:g}"},
    )
    async with connect(APP, site.url) as client:
        r = await submit_id(client, "ticker", {"seconds": 300, "then": 0.5, "every": 0.1, "marks": str(marks_r)})
        n = await submit_id(
            client, "ticker_once", {"seconds": 300, "every": 0.1, "marks": str(marks_n), "until": str(release_n)}
        )

        async def running_on_a(job_id: str) -> Job | None:
            job = await client.job(job_id)
            ticked = any(e.type == "tick" for e in await client.events(job_id))
            return job if job.state is JobState.RUNNING and _of(a, job) and ticked else None

        for job_id in (r, n):
            await _within("R and N to run (and tick) on worker A", 30, lambda j=job_id: running_on_a(j), site)
        p = await submit_id(client, "echo", {"pre_start": True})
        parked = await _within(
            "worker A to claim P (and park before its start)",
            20,
            lambda: _job_where(client, p, lambda j: _of(a, j) and j.execution_started_at is None),
            site,
        )
        assert parked.state is JobState.QUEUED and parked.epoch == 1, parked
        claimed_at = time.monotonic()
        b = site.worker(host_b, "worker-b", concurrency=3)
        await _within("worker B to register", 30, lambda: _registered(client, b), site)
        # The cut (about 4 s) must end before A's parked start is sent, so that the start is a write after the cut.
        assert time.monotonic() - claimed_at < PARK_S - 6, "worker B took too long to start"
        execution_r1 = (await client.job(r)).execution_id
        execution_n1 = (await client.job(n)).execution_id
        assert _of(a, await client.job(p)) and (await client.job(p)).execution_started_at is None

        host_a.cut()
        cut_at = host_a.cut_at
        assert cut_at is not None
        release_n.touch()  # N's handler returns now, on a host that cannot write: its finish waits in A

        # While A is away: P released and run by B with epoch 2, N lost, R run again by B.
        bound = TTL + SWEEP + 15
        p_done = await _within(
            "P to be released and run by B", bound, lambda: _job_where(client, p, lambda j: j.state.terminal), site
        )
        n_done = await _within(
            "N to be declared lost", bound, lambda: _job_where(client, n, lambda j: j.state.terminal), site
        )
        r_done = await _within(
            "R to run again elsewhere", bound, lambda: _job_where(client, r, lambda j: j.state.terminal), site
        )
        timings = {
            "P started on B after the cut (s)": round((p_done.execution_started_at or 0) - cut_at, 2),
            "N lost after the cut (s)": round((n_done.finished_at or 0) - cut_at, 2),
            "R succeeded on B after the cut (s)": round((r_done.finished_at or 0) - cut_at, 2),
        }
        print(f"\nworker host cut: {timings}")

        assert p_done.state is JobState.SUCCEEDED and p_done.epoch == 2, (p_done, site.logs())
        p_runs = await client.store.list_executions(p)
        assert [(e.epoch, e.outcome) for e in p_runs] == [(2, "succeeded")]
        assert f":{b.pid}:" in p_runs[0].worker_id
        assert [(e.epoch, e.type) for e in await client.events(p)] == [(2, "execution.started"), (2, "job.succeeded")]

        assert n_done.state is JobState.LOST and n_done.error_code == "owner_lost", n_done
        assert n_done.epoch == 1 and n_done.result is None
        assert [(e.epoch, e.outcome) for e in await client.store.list_executions(n)] == [(1, "lost")]

        assert r_done.state is JobState.SUCCEEDED and r_done.epoch == 2, (r_done, site.logs())
        r_runs = await client.store.list_executions(r)
        assert [(e.epoch, e.outcome) for e in r_runs][1:] == [(2, "succeeded")], r_runs
        assert (r_runs[0].id, r_runs[0].epoch, r_runs[0].outcome) == (execution_r1, 1, "lost")
        assert f":{a.pid}:" in r_runs[0].worker_id and f":{b.pid}:" in r_runs[1].worker_id
        assert r_done.result["execution_id"] == r_runs[1].id != execution_r1
        # A's executions stop themselves once no heartbeat got through for a TTL (self-fencing): their ticks end.
        await asyncio.sleep(max(0.0, cut_at + TTL + 2.0 - time.time()))
        a_ticks = [m for m in _marks(marks_r) if m[0] == execution_r1]
        assert a_ticks and a_ticks[-1][3] <= cut_at + TTL + 1.0, (
            f"R's first execution ticked {a_ticks[-1][3] - cut_at:.1f}s after A's cable was pulled "
            f"(claim TTL {TTL}s): it was not fenced by its own worker\n{site.logs()}"
        )
        # Everything as it is while A is away; nothing after this is a legitimate write.
        rows = {j: _row(await client.job(j)) for j in (p, n, r)}
        histories = {j: await _history(client, j) for j in (p, n, r)}
        assert not any(execution_n1 == h[2] and h[3] == "job.succeeded" for h in histories[n])

        host_a.heal()
        healed_at = host_a.healed_at
        assert healed_at is not None

        # The late writes happen: the finish of N (sent during the cut) and the parked start CAS of P.
        await _within(
            "A's finish of N to reach the database and match nothing",
            20,
            lambda: _logged(a, f"finish of job {n} matched no row"),
            site,
        )
        await _within(
            "A's parked start of P to match nothing",
            PARK_S + 10,
            lambda: _logged(a, f"start CAS for job {p} (epoch 1) matched no row"),
            site,
        )
        assert site.forwarder.last_received.get(host_a.address, 0) > healed_at, "A never talked to the database again"
        await asyncio.sleep(1.0)  # and every chance to write more
        assert {j: _row(await client.job(j)) for j in (p, n, r)} == rows
        assert {j: await _history(client, j) for j in (p, n, r)} == histories
        assert len([m for m in _marks(marks_r) if m[0] == execution_r1]) == len(a_ticks)
        assert {h[0] for h in histories[p]} == {2}
        assert {(h[0], h[2]) for h in histories[n]} == {(1, execution_n1)}
        assert [h[3] for h in histories[n]][-1] == "job.lost"
        assert {(h[0], h[2]) for h in histories[r]} == {(1, execution_r1), (2, r_runs[1].id)}
        assert [h[3] for h in histories[r] if h[0] == 1][-1] == "execution.lost"
        second = [h[3] for h in histories[r] if h[0] == 2]
        assert second[0] == "execution.started" and second[-1] == "job.succeeded" and set(second[1:-1]) == {"tick"}
        assert a.proc.poll() is None, a.log()


async def _logged(proc: TenureProc, text: str) -> bool:
    return text in proc.log()


# -- 2. a gateway host cut off -------------------------------------------------------------------------------------
TERMINAL = {"job.succeeded", "job.failed", "job.cancelled", "job.lost", "job.expired", "job.dead"}
STALL_S = 3.0  # a follower that hears nothing for this long (the job ticks every 50 ms) tries the other gateway


@dataclass
class Follower:
    """A client following one job's stream across gateways: on a stall or a connection error it reconnects to
    the next gateway with the cursor of the last event it received (`Last-Event-ID` / `after`)."""

    urls: list[str]
    job_id: str
    received: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (gateway index, event)
    switched_at: list[float] = field(default_factory=list)

    @property
    def cursor(self) -> str | None:
        return self.received[-1][1]["id"] if self.received else None

    def got(self, gateway: int, event: dict[str, Any]) -> bool:
        self.received.append((gateway, event))
        return event["type"] in TERMINAL

    def next_gateway(self, gateway: int) -> int:
        self.switched_at.append(time.time())
        return (gateway + 1) % len(self.urls)


async def follow_sse(f: Follower) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    gateway = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=STALL_S)) as http:
        while True:
            h = headers | ({"Last-Event-ID": f.cursor} if f.cursor else {})
            try:
                async with http.stream("GET", f"{f.urls[gateway]}/v1/jobs/{f.job_id}/events", headers=h) as resp:
                    if resp.status_code == 204:  # finished, nothing after the cursor
                        return
                    assert resp.status_code == 200, resp.status_code
                    fields: dict[str, str] = {}
                    async for line in resp.aiter_lines():
                        if line.startswith(":"):
                            continue
                        if line:
                            name, _, value = line.partition(":")
                            fields[name] = value.removeprefix(" ")
                            continue
                        if "data" in fields and f.got(gateway, json.loads(fields["data"])):
                            return
                        fields = {}
            except httpx.TransportError:
                pass
            gateway = f.next_gateway(gateway)


async def follow_ws(f: Follower) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    gateway = 0
    while True:
        url = f.urls[gateway].replace("http://", "ws://") + "/v1/ws"
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=5, close_timeout=1) as ws:
                frame: dict[str, Any] = {"op": "subscribe", "job_id": f.job_id}
                if f.cursor:
                    frame["after"] = f.cursor
                await ws.send(json.dumps(frame))
                while True:
                    answer = json.loads(await asyncio.wait_for(ws.recv(), STALL_S))
                    assert answer["op"] in ("subscribed", "event", "end"), answer
                    if answer["op"] == "end" or (answer["op"] == "event" and f.got(gateway, answer["event"])):
                        return
        except (TimeoutError, OSError, websockets.exceptions.WebSocketException):
            pass
        gateway = f.next_gateway(gateway)


async def test_a_gateway_host_cut_off_its_clients_resume_on_the_other_gateway_without_gap_or_duplicate(
    site: Site,
) -> None:
    """Gateways A and B and a worker, each on a host of its own. An SSE client and a WebSocket client follow a
    ticking job through A; A's cable is pulled. Each client hears nothing more, reconnects to B with the cursor
    of the last event it got, and receives the rest: what each received, in order, is the job's durable
    history exactly, with no gap and no duplicate."""
    net = site.network
    host_a, host_b, host_w = net.add_host("gateway-a"), net.add_host("gateway-b"), net.add_host("worker")
    a, b = site.gateway(host_a, "gateway-a"), site.gateway(host_b, "gateway-b")
    w = site.worker(host_w, "worker", concurrency=2)
    await asyncio.to_thread(a.wait_ready)
    await asyncio.to_thread(b.wait_ready)
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(
            f"{a.url}/v1/jobs",
            json={"agent": "ticker", "input": {"seconds": 8, "every": 0.05}},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    sse, ws = Follower([a.url, b.url], job_id), Follower([a.url, b.url], job_id)
    followers = asyncio.gather(
        asyncio.wait_for(follow_sse(sse), 60), asyncio.wait_for(follow_ws(ws), 60), return_exceptions=True
    )

    async def both_ticking_through_a() -> bool:
        return all(sum(1 for g, e in f.received if g == 0 and e["type"] == "tick") >= 10 for f in (sse, ws))

    try:
        await _within("both clients to follow the job through gateway A", 30, both_ticking_through_a, site)
        assert w.proc.poll() is None, w.log()
        host_a.cut()
        cut_at = host_a.cut_at
        assert cut_at is not None
    finally:
        results = await followers
    assert all(r is None for r in results), results

    async with connect(APP, site.url) as client:
        job = await client.job(job_id)
        history = [(f"{e.epoch}-{e.seq}", e.type, e.payload) for e in await client.events(job_id)]
    assert job.state is JobState.SUCCEEDED, (job, site.logs())
    assert history[-1][1] == "job.succeeded" and len(history) > 40
    for name, f in (("SSE", sse), ("WebSocket", ws)):
        streamed = [(e["id"], e["type"], e["payload"]) for _, e in f.received]
        assert streamed == history, f"{name}: the resumed stream differs from the durable history"
        gateways = [g for g, _ in f.received]
        assert gateways == sorted(gateways) and gateways[0] == 0 and gateways[-1] == 1, f"{name}: {gateways}"
        through_a = [e for g, e in f.received if g == 0]
        assert all(e["ts"] <= cut_at for e in through_a), f"{name}: an event came through A after its cable was cut"
        assert f.switched_at and f.switched_at[0] >= cut_at
        # Through B: first what was appended while the client heard nothing (history), then the live tail.
        through_b = [e for g, e in f.received if g == 1]
        assert any(e["ts"] < f.switched_at[-1] for e in through_b), f"{name}: nothing was read from history"
        assert any(e["ts"] > f.switched_at[-1] for e in through_b), f"{name}: nothing came live through B"
        resumed_s = round(f.switched_at[0] - cut_at, 2)
        print(f"\n{name}: {len(through_a)} events through A, {len(gateways) - len(through_a)} through B, "
              f"switched {resumed_s}s after the cut")  # fmt: skip


# -- 3. a worker partitioned from Redis only -----------------------------------------------------------------------
# redis-py's TCP keepalive (30 s idle, then 3 probes 5 s apart): a partition longer than this ends the worker's
# idle Redis connections with ETIMEDOUT, which is what once blocked its event loop (backends/redis/channel.py).
KEEPALIVE_S = 45.0
POLL_S = float(FAST["TENURE_POLL_S"])
PICKUP_BOUND_S = POLL_S + 2.0  # with Redis partitioned: the poll, or a bounded wait for the index


async def _metrics(url: str) -> str:
    async with httpx.AsyncClient(timeout=5) as http:
        return (await http.get(url)).text


def _sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1 : line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pickup_s(jobs: list[Job]) -> list[float]:
    """Submit to start, per job, sorted."""
    return sorted(round((j.execution_started_at or 0) - j.created_at, 3) for j in jobs)


@pytest.mark.timeout(240)
async def test_a_worker_partitioned_from_redis_only_keeps_working_through_postgresql_and_its_quotas_fail_as_configured(
    site: Site, tmp_path: Path
) -> None:
    """A worker on a host of its own, with Redis (leases, ready index, hints) on the bridge. Its packets to and
    from Redis are dropped, nothing else, for longer than TCP keepalive: it still claims and finishes jobs
    through PostgreSQL, picked up within the poll interval plus a bounded wait for the index; jobs under the
    fail-closed quota `k` fail with `QuotaUnavailable` (dead after their two attempts); jobs under the fail-open
    quota `j` run. Once the partition heals, `k` admits again."""
    net = site.network
    redis = RedisProc(tmp_path, bind=net.gateway)
    try:
        host = net.add_host("worker")
        metrics_port = 9464
        w = site.worker(
            host,
            "worker",
            concurrency=4,
            env={"TENURE_REDIS_URL": redis.url, "TENURE_QUOTAS": "k=2,j=2/fail-open"},
            args=("--metrics-port", str(metrics_port), "--metrics-host", host.address),
        )
        metrics_url = f"http://{host.address}:{metrics_port}/metrics"
        settings = Settings.of(database_url=site.url, redis_url=redis.url)
        async with connect(APP, settings=settings) as client:
            await _within("the worker to register", 30, lambda: _registered(client, w), site)

            async def run_all(jobs: list[str], within_s: float) -> list[Job]:
                async def all_terminal() -> list[Job] | None:
                    found = [await client.job(j) for j in jobs]
                    return found if all(j.state.terminal for j in found) else None

                return await _within(f"{len(jobs)} jobs to end", within_s, all_terminal, site)

            async def plain_jobs(n: int, tag: str) -> list[str]:
                ids = []
                for i in range(n):
                    ids.append(await submit_id(client, "echo", {tag: i}))
                    await asyncio.sleep(0.5)
                return ids

            async def succeeded_on_the_worker(jobs: list[Job]) -> None:
                for job in jobs:
                    assert job.state is JobState.SUCCEEDED, (job, site.logs())
                    runs = await client.store.list_executions(job.id)
                    assert [f":{w.pid}:" in e.worker_id for e in runs] == [True], runs

            # Before: everything through Redis.
            before = await run_all(
                [await submit_id(client, "echo", {"n": i}) for i in range(3)]
                + [await submit_id(client, "quota_call", {"key": key}) for key in ("k", "j")],
                30,
            )
            await succeeded_on_the_worker(before)

            host.block(redis.bind, redis.port)
            partitioned_at = time.time()
            assert not await asyncio.to_thread(host.reaches, redis.bind, redis.port, 1.0)
            assert await asyncio.to_thread(host.reaches, site.network.gateway, site.forwarder.port)
            plain = await plain_jobs(6, "partitioned")
            closed = [await submit_id(client, "quota_call", {"key": "k"}) for _ in range(2)]
            opened = [await submit_id(client, "quota_call", {"key": "j"}) for _ in range(2)]
            by_id = {j.id: j for j in await run_all(plain + closed + opened, 90)}
            await succeeded_on_the_worker([by_id[j] for j in plain + opened])
            for job_id in closed:
                job = by_id[job_id]
                assert job.state is JobState.DEAD and job.error_code == "quota_unavailable", (job, site.logs())
                outcomes = [e.outcome for e in await client.store.list_executions(job_id)]
                assert len(outcomes) == 2 and outcomes[-1] == "dead", outcomes
            text = await _metrics(metrics_url)
            assert _sample(text, "tenure_quota_fail_open_total", key="j") >= 2, text
            assert _sample(text, "tenure_quota_rejected_total", key="k", reason="unavailable") >= 2, text

            # Still partitioned, past TCP keepalive: the Redis connections have timed out; the worker works on.
            await asyncio.sleep(max(0.0, partitioned_at + KEEPALIVE_S + 5 - time.time()))
            late = await run_all(await plain_jobs(4, "past_keepalive"), 30)
            await succeeded_on_the_worker(late)
            pickups = {
                "before": _pickup_s(before[:3]),
                "partitioned": _pickup_s([by_id[j] for j in plain]),
                "past keepalive": _pickup_s(late),
            }
            print(
                f"\nredis partition: pickup (s) {pickups}; k dead after "
                f"{round(max(by_id[j].finished_at or 0 for j in closed) - partitioned_at, 1)}s, j ran after "
                f"{round(max(by_id[j].finished_at or 0 for j in opened) - partitioned_at, 1)}s"
            )
            assert max(pickups["partitioned"] + pickups["past keepalive"]) <= PICKUP_BOUND_S, (pickups, site.logs())

            host.unblock()
            # The last refusal short-circuits the backend for 3 s (docs/quotas.md): admissions resume after it.
            await asyncio.sleep(4.0)
            (after,) = await run_all([await submit_id(client, "quota_call", {"key": "k"})], 60)
            assert after.state is JobState.SUCCEEDED, (after, site.logs())
    finally:
        redis.kill()
