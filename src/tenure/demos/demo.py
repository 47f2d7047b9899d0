"""`make demo` / `tenure demo`: the connection, the job and the execution owner are three identities.

Seed 000, second layer: a long job keeps worker 1 busy; short jobs that arrive meanwhile must not queue
behind it. An idle worker takes each at once, because a job is a durable row that any worker may claim with a
conditional UPDATE, not an object pinned to the process that received it. Then the two sides of the recovery
boundary, `execution.started`:

* a worker that **claimed but never started** a job is killed: the claim expires unrenewed, the sweeper
  releases it and another worker claims it again with a higher epoch (nothing had run, so running it is safe);
* a worker that **started** a job (and already made its side effect) is killed: the job becomes `lost`, and is
  never silently run a second time (the side-effect counter stays at 1);
* unless its agent is retry-safe with its effects journaled (4b, `_journal_step.py`): then it is requeued, and
  the next attempt skips its done steps and is told of the one the kill interrupted.

Everything runs on one temporary SQLite file and three real `tenure worker` processes (a fourth replaces the one
killed in 4b); no other service.
Worker 3 runs with the fault-injection hook `TENURE_FAULTS=after_claim=sleep:60` so that the window between
claim and start, normally a few milliseconds, lasts long enough to be seen (and killed in).

    python -m tenure.demos.demo [--keep]

Exit status 0 when every step behaved as described. Otherwise it prints what it saw and exits 1 (130 on
Ctrl-C, 143 on SIGTERM). Worker processes run in their own process groups, and every group is killed before
the demo returns, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import tenure
from tenure.contracts.states import JobState
from tenure.contracts.types import Event, Job
from tenure.control.admission import JobRequest
from tenure.demos._journal_step import step_journaled
from tenure.demos._stage import (
    APP,
    BUSY_S,
    CLAIM_TTL_S,
    CRASH_SLEEP_S,
    EXTRA_ROUNDS,
    FAULTS_W3,
    HEARTBEAT_S,
    LONG_S,
    PARK_S,
    SHORT_JOBS,
    STEP_TIMEOUT_S,
    SWEEP_INTERVAL_S,
    DemoFailure,
    Stage,
    Tracked,
    _events_line,
    _free_port,
    _ms,
    _read_counter,
    _tail,
)
from tenure.local import connect
from tenure.settings import Settings


class Demo(Stage):
    """The steps of the demo, in order (see the module docstring)."""

    # -- the story ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        print("Tenure demo: the connection, the job and the execution owner are three identities")
        print(f"  store     {self.database_url}  (one SQLite file; no other service)")
        print(
            f"  timings   heartbeat {HEARTBEAT_S:g} s · claim TTL {CLAIM_TTL_S:g} s · sweep every "
            f"{SWEEP_INTERVAL_S:g} s · every worker runs with --concurrency 1"
        )
        print("  clock     [s.ss] = seconds since the demo started")
        settings = Settings.of(
            database_url=self.database_url,
            app=APP,
            heartbeat_s=HEARTBEAT_S,
            claim_ttl_s=CLAIM_TTL_S,
            sweep_interval_s=SWEEP_INTERVAL_S,
        )
        async with connect(APP, settings=settings) as client:
            self.client = client
            try:
                long = await self.step_busy_worker()
                parked = await self.step_short_jobs(long)
                await self.step_reclaim(parked)
                await self.step_lost()
                await self.until(f"{long.label} to finish", lambda: self.terminal(long), STEP_TIMEOUT_S)
                await step_journaled(self, len(self.workers) + 1)
                await self.final_table()
                await self.check_final()
                self.section("5. shutdown")
                await self.shutdown()
                self.section("6. the gateway: HTTP + SSE, a global quota, the mock model")
                await self.step_gateway()
                if self.ui:
                    self.section("7. the dashboard")
                    await self.step_dashboard()
            except DemoFailure as exc:
                print(f"\nUNEXPECTED: {exc}", flush=True)
                with contextlib.suppress(Exception):
                    await self.show_seen()
                raise
            finally:
                self.client = None

    async def step_busy_worker(self) -> Tracked:
        self.section("1. worker W1 gets busy with a long job")
        w1 = self.spawn_worker(1)
        await self.wait_registered([w1])
        long = await self.submit("long", "sleep", {"seconds": LONG_S, "every": 0.5})
        self.log(f"submitted {long.label}: sleep {LONG_S:g} s")

        async def claimed() -> Job | None:
            job = await self.job(long)
            return job if job.owner is not None else None

        job = await self.until(f"{long.label} to be claimed", claimed, STEP_TIMEOUT_S)
        if job.owner != w1.worker_id:
            raise DemoFailure(f"{long.label} was claimed by {job.owner}, not by W1")
        self.log(f"{long.label} claimed by W1 (epoch {job.epoch}) and started: W1's only slot is taken")
        self.say("(W1 starts alone so that the busy worker is W1, as in the seed's scenario)")

        w2 = self.spawn_worker(2)
        w3 = self.spawn_worker(3, FAULTS_W3)
        self.say(f"W3 runs with a FAULT-INJECTION hook: its first claim sleeps {PARK_S} s between the claim")
        self.say("and the start CAS. The hook only stretches a window that normally lasts milliseconds (a GC")
        self.say("pause, a network stall or a SIGSTOP can land there too) so that the demo can show it.")
        await self.wait_registered([w2, w3])
        return long

    async def step_short_jobs(self, long: Tracked) -> Tracked:
        self.section("2. short jobs arrive while W1 is busy; W2 and W3 are idle")
        job = await self.job(long)
        if job.state is not JobState.RUNNING:
            raise DemoFailure(f"{long.label} is already {job.state.value}: the machine is too slow for this")
        labels = [f"short-{i}" for i in range(1, SHORT_JOBS + 1)]
        batch = [JobRequest("echo", {"n": i}) for i in range(1, SHORT_JOBS + 1)]
        shorts = await self.submit_batch(labels, batch)
        self.log(f"submitted {SHORT_JOBS} short echo jobs in one batch")
        await self.settle(shorts)
        parked = await self.find_parked(shorts)
        rounds = 0
        while parked is None and rounds < EXTRA_ROUNDS:
            # The doorbell wakes W2 and W3 together; W2, warm from its last job, can win every claim of a batch
            # of echo jobs that each take a millisecond. Two more jobs settle it: whichever worker takes the
            # first, a BUSY_S-second sleep, is busy (or parked) while the other must take the echo.
            rounds += 1
            n = len(shorts)
            self.log(
                f"W3 won no claim of the batch (W2 was quicker each time); offering "
                f"short-{n + 1} (sleep {BUSY_S:g} s) and short-{n + 2} (echo)"
            )
            more = await self.submit_batch(
                [f"short-{n + 1}", f"short-{n + 2}"],
                [JobRequest("sleep", {"seconds": BUSY_S, "every": BUSY_S}), JobRequest("echo", {"n": n + 2})],
            )
            shorts.extend(more)
            await self.settle(more)
            parked = await self.find_parked(shorts)
        if parked is None:
            raise DemoFailure("no worker ever held an unstarted claim: W3's fault hook never fired")

        waits: list[float] = []
        for t in shorts:
            job = await self.job(t)
            if t is parked:
                self.say(
                    f"{t.label:9} {job.agent:5} -> {self.name(job.owner)}  claimed after "
                    f"{_ms(job.claimed_at, job.created_at)} ms, NOT started (parked in the fault hook)"
                )
                continue
            waits.append((job.execution_started_at or 0) - job.created_at)
            wait_ms = _ms(job.execution_started_at, job.created_at)
            self.say(
                f"{t.label:9} {job.agent:5} -> {self.name(await self.runner(job))}  queue wait "
                f"(start - submit) {wait_ms:>4} ms, {job.state.value}"
            )
        long_job = await self.job(long)
        if long_job.state is not JobState.RUNNING:
            raise DemoFailure(
                f"{long.label} should still be running on W1, but it is {long_job.state.value} "
                f"({long_job.error_code}: {long_job.error_message}); its events: "
                + _events_line(self, await self.events(long))
            )
        left = max(0.0, (long_job.execution_started_at or 0) + LONG_S - time.time())
        self.log(
            f"{len(waits)} of {len(shorts)} short jobs started on an idle worker, the slowest "
            f"{max(waits, default=0) * 1000:.0f} ms after submission; W1 is still running {long.label} "
            f"(≈{left:.1f} s left)"
        )
        self.say("The submitter never chose a worker: each job is a row, owned by whichever idle worker won")
        self.say("the claim CAS (UPDATE ... WHERE state = 'queued' AND owner IS NULL ...). Pinned to W1, the")
        self.say(f"process that held the connection, they would have waited ≈{left:.1f} s more behind {long.label}.")
        return parked

    async def step_reclaim(self, parked: Tracked) -> None:
        self.section("3. a worker dies holding a claim it never started: the job is claimed again")
        job = await self.job(parked)
        holders = [w for w in await self.c.workers() if job.id in w.jobs_held]
        if len(holders) != 1 or holders[0].id != job.owner:
            raise DemoFailure(f"{parked.label} is owned by {job.owner}, but the registry says {holders}")
        holder = self._proc(holders[0])
        if holder.n != 3:
            raise DemoFailure(f"the unstarted claim is held by {holder.label}, not by the faulty W3")
        self.log(
            f"registry: {holder.label} holds {parked.label}; the job is {job.state.value} with owner "
            f"{holder.label}, epoch {job.epoch}, no execution started"
        )
        first_expiry = job.claim_expires_at or 0.0

        async def renewed() -> Job | None:
            j = await self.job(parked)
            return j if (j.claim_expires_at or 0) > first_expiry else None

        job = await self.until("W3's heartbeat to renew its claim", renewed, 3 * HEARTBEAT_S + 2)
        self.log(
            f"{holder.label} is alive and heartbeating: its claim's expiry moved "
            f"+{(job.claim_expires_at or 0) - first_expiry:.2f} s, so no other worker may take the job"
        )
        epoch_before = job.epoch
        killed_at = await self.kill(holder)
        self.log(f"SIGKILL {holder.label} (pid {holder.pid}): its heartbeats stop, its claim will expire")

        async def reclaimed() -> Job | None:
            j = await self.job(parked)
            return j if j.epoch > epoch_before and j.execution_started_at is not None else None

        await self.until(f"{parked.label} to be claimed again", reclaimed, CLAIM_TTL_S + STEP_TIMEOUT_S)
        job = await self.until(f"{parked.label} to finish", lambda: self.terminal(parked), STEP_TIMEOUT_S)
        by = self.name(await self.runner(job))
        took = (job.claimed_at or 0) - killed_at
        bound = CLAIM_TTL_S + SWEEP_INTERVAL_S
        verdict = "within" if took <= bound + 0.25 else "OVER (a busy machine?)"
        parked.note = f"W3 claimed it at epoch {epoch_before}, never started, was killed"
        self.log(
            f"the sweeper released the expired claim: {parked.label} claimed by {by} at epoch "
            f"{job.epoch} (was {epoch_before}), {took:.2f} s after the kill"
        )
        self.say(f"({verdict} the bound claim TTL + one sweep interval = {bound:g} s)")
        self.say(f"{parked.label} {job.state.value} on {by}; events: " + _events_line(self, await self.events(parked)))
        self.say(f"Epoch {epoch_before} left no execution and no event: it never reached execution.started,")
        self.say("so running the job elsewhere repeats nothing. Had W3 woken up instead of dying, its start")
        self.say(f"CAS (epoch {epoch_before}, old token) would have matched no row.")
        if job.epoch <= epoch_before or by == holder.label:
            raise DemoFailure(f"{parked.label} was not claimed again by another worker with a higher epoch")

    async def step_lost(self) -> None:
        self.section("4. a worker dies after the job started: lost, never run twice")
        counter = self.workdir / "counter"
        crash = await self.submit("crash", "crash_after_effect", {"counter": str(counter), "seconds": CRASH_SLEEP_S})
        self.log(
            f"submitted {crash.label}: crash_after_effect (adds 1 to the file {counter.name}, then "
            f"sleeps {CRASH_SLEEP_S:g} s)"
        )

        async def effect_done() -> list[Event] | None:
            events = await self.events(crash)
            return events if {"execution.started", "effect"} <= {e.type for e in events} else None

        events = await self.until(f"{crash.label} to make its side effect", effect_done, STEP_TIMEOUT_S)
        started = next(e for e in events if e.type == "execution.started")
        worker_id = started.payload.get("worker_id") if isinstance(started.payload, dict) else None
        victim = next((w for w in self.workers if w.worker_id == worker_id), None)
        if victim is None or victim.killed:
            raise DemoFailure(f"{crash.label} runs on {worker_id}, which is not a live worker of this demo")
        job = await self.job(crash)
        epoch = job.epoch
        self.log(
            f"{crash.label} is running on {victim.label} at epoch {epoch} (execution.started at "
            f"{self.rel(started.ts)}); its side effect is done: counter = {_read_counter(counter)}"
        )
        killed_at = await self.kill(victim)
        self.log(f"SIGKILL {victim.label} (pid {victim.pid}) in the middle of the execution")

        job = await self.until(f"{crash.label} to end", lambda: self.terminal(crash), CLAIM_TTL_S + STEP_TIMEOUT_S)
        if job.state is not JobState.LOST:
            raise DemoFailure(f"{crash.label} ended {job.state.value} ({job.error_code}), expected lost")
        self.log(
            f"the sweeper marked {crash.label} {job.state.value} ({job.error_code}) "
            f"{(job.finished_at or 0) - killed_at:.2f} s after the kill"
        )
        grace = 2 * SWEEP_INTERVAL_S + HEARTBEAT_S
        await asyncio.sleep(grace)  # give a wrongful second run every chance to happen
        job = await self.job(crash)
        value = _read_counter(counter)
        execs = await self.executions(crash)
        self.log(
            f"{grace:g} s later: state {job.state.value}, epoch {job.epoch}, {len(execs)} execution, counter file = {value}"
        )
        self.say("It had passed execution.started, so its effect may have happened (here it did). Tenure")
        self.say("records `lost` and leaves the decision to a person (`tenure requeue`); only an agent")
        self.say("declared retry-safe, with its effects in the journal, is run again automatically.")
        self.say("events: " + _events_line(self, await self.events(crash)))
        crash.note = f"{victim.label} killed after the effect; counter = {value}"
        if job.state is not JobState.LOST or job.epoch != epoch or value != 1 or len(execs) != 1:
            raise DemoFailure(
                f"{crash.label}: state {job.state.value}, epoch {job.epoch}, {len(execs)} executions, "
                f"counter {value}; expected lost, epoch {epoch}, 1 execution, counter 1"
            )

    # -- reporting ---------------------------------------------------------------------------------------
    async def step_gateway(self) -> None:
        """`tenure up` (one gateway, two workers) and the bundled mock model: chat jobs submitted over HTTP stream
        their tokens back over SSE, and the global quota `llm:mock` keeps the model from ever answering 429."""
        import httpx

        from tenure.client import Client

        limit, jobs = 4, 12
        model_port, gateway_port = _free_port(), _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        src = os.path.dirname(os.path.dirname(tenure.__file__))  # the children run this same tenure
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.update(
            TENURE_DATABASE_URL=f"sqlite:///{self.workdir}/gateway.db",
            TENURE_APP=APP,
            TENURE_CONCURRENCY="4",
            TENURE_QUOTAS=f"llm:mock={limit}",
            TENURE_MODEL_URL=f"http://127.0.0.1:{model_port}/v1",
            TENURE_LOG_LEVEL="warning",
        )
        model = self._service(
            [
                sys.executable,
                "-m",
                "tenure.cli",
                "mock-model",
                "--port",
                str(model_port),
                "--max-concurrency",
                str(limit),
                "--latency-ms",
                "40",
                "--tokens",
                "12",
            ],
            env,
            "mock-model.log",
        )
        up = self._service(
            [sys.executable, "-m", "tenure.cli", "up", "--port", str(gateway_port), "--workers", "2"], env, "up.log"
        )
        self.log(
            f"mock model on :{model_port} (answers 429 above {limit} requests in flight); "
            f"`tenure up` on :{gateway_port} with TENURE_QUOTAS=llm:mock={limit}"
        )
        url = f"http://127.0.0.1:{gateway_port}"
        async with httpx.AsyncClient(timeout=5) as http:

            async def ready() -> bool | None:
                try:
                    r = await http.get(url + "/v1/workers")
                except httpx.HTTPError:
                    return None
                return True if r.status_code == 200 and len(r.json()["workers"]) >= 2 else None

            deadline = time.monotonic() + 30  # not self.until(): the workers of steps 1-5 have left on purpose
            while not await ready():
                if time.monotonic() > deadline or up.poll() is not None:
                    raise DemoFailure(f"`tenure up` did not get ready (see {self.workdir / 'up.log'})")
                await asyncio.sleep(0.1)
            async with Client(url) as client:
                ids = [
                    (await client.submit("chat", {"prompt": f"question {i}", "max_tokens": 12})).job.id for i in range(jobs)
                ]
                self.log(f"submitted {jobs} `chat` jobs over HTTP; following the first one's SSE stream:")
                text, events = [], 0
                async for event in client.stream(ids[0]):
                    events += 1
                    if event.type == "message.delta":
                        text.append(event.payload["text"])
                self.say(f"{events} events, streamed tokens: {''.join(text)!r}")
                states = [(await client.wait(i, 60)).state.value for i in ids]
            stats = (await http.get(f"http://127.0.0.1:{model_port}/stats")).json()
        done = sum(1 for st in states if st == "succeeded")
        self.log(
            f"{done} of {jobs} chat jobs succeeded; the mock model saw {stats['requests']} requests, "
            f"at most {stats['max_in_flight']} at once, and answered 429 {stats['rejected_429']} times"
        )
        if done != jobs or stats["rejected_429"] != 0 or stats["max_in_flight"] > limit:
            raise DemoFailure(f"gateway step: {done}/{jobs} succeeded, model stats {stats}")
        for proc in (up, model):
            proc.send_signal(signal.SIGTERM)  # `tenure up` drains its workers and stops its gateway
        for proc in (up, model):
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                raise DemoFailure(f"pid {proc.pid} did not stop on SIGTERM") from None
        self.log("`tenure up` and the mock model stopped cleanly")

    async def step_dashboard(self) -> None:
        """Start `tenure up` again on step 6's store and leave it running (its own session, not killed with the
        demo's processes), so the jobs of the demo can be looked at in the dashboard."""
        import httpx

        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        src = os.path.dirname(os.path.dirname(tenure.__file__))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.update(TENURE_DATABASE_URL=f"sqlite:///{self.workdir}/gateway.db", TENURE_APP=APP, TENURE_LOG_LEVEL="warning")
        proc = self._detached([sys.executable, "-m", "tenure.cli", "up", "--port", str(port), "--workers", "2"], env)
        url = f"http://127.0.0.1:{port}/ui"
        async with httpx.AsyncClient(timeout=2) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (await http.get(url)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise DemoFailure(f"the dashboard's `tenure up` did not start (see {self.workdir / 'up-dashboard.log'})")
                await asyncio.sleep(0.2)
        self.log(f"`tenure up` (pid {proc.pid}) keeps running on step 6's store; stop it with: kill {proc.pid}")
        print(f"\ndashboard: {url}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tenure demo",
        description="Three workers on one SQLite file: short jobs go to idle workers at once; the unstarted "
        "claim of a killed worker is claimed again with a higher epoch; the started job of a killed worker "
        "becomes lost and is not run twice.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (database, logs)")
    parser.add_argument(
        "--ui",
        action="store_true",
        help="at the end, leave `tenure up` running on the demo's store and print its dashboard URL",
    )
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="tenure-demo-"))
    demo = Demo(workdir, ui=args.ui)
    code, failed, terminated = 1, True, False

    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            if task is not None:
                task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            await demo.run()
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        asyncio.run(run())
        code, failed = 0, False
        print("\ndemo finished: every step behaved as described.", flush=True)
    except DemoFailure:
        print("\ndemo FAILED (see UNEXPECTED above)", flush=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: killing the workers", flush=True)
        code, failed = (143 if terminated else 130), False
    except Exception as exc:
        print(f"\nUNEXPECTED ERROR: {type(exc).__name__}: {exc}", flush=True)
    finally:
        demo.kill_all()
        if failed:
            for w in demo.workers:
                print(f"--- last lines of {w.label}'s log ({w.log_path}):")
                for line in _tail(w.log_path):
                    print(f"    {line}")
        if args.keep or failed or (args.ui and not failed):
            print(f"kept {workdir} (database and worker logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
