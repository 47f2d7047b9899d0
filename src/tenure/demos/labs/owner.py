"""Lab 2, who owns the job: short jobs go to idle workers; a claim whose worker froze before its start moves on.

Three workers with one slot each (heartbeat 0.5 s, claim TTL 1.5 s). W1 offers the capability `w1` and W2 `w2`,
so the lab can make exactly one of them busy; W3 claims in two steps with the fault hook
`after_claim@lab_victim=stop`: the first `lab_victim` job it claims freezes it (SIGSTOP) between its claim and
its start CAS.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from tenure.contracts.states import JobState
from tenure.demos.labs._harness import Harness, emit, lab_store

LONG_S = 14.0


async def run(h: Harness, params: dict[str, Any]) -> None:
    short_jobs = int(params.get("short_jobs", 6))
    emit(
        "info",
        text="three workers with one slot each; W3 freezes after claiming a lab_victim job",
        workers=["W1", "W2", "W3"],
        claim_ttl_s=h.claim_ttl_s,
    )
    async with lab_store(h) as client:
        w1 = h.spawn("W1", env={"TENURE_CAPABILITIES": "w1"})
        w2 = h.spawn("W2", env={"TENURE_CAPABILITIES": "w2"})
        w3 = h.spawn("W3", env={"TENURE_CLAIM_MODE": "two_step", "TENURE_FAULTS": "after_claim@lab_victim=stop"})
        await h.registered(client, [w1, w2, w3])
        labels: dict[str, str] = {}

        async def snapshot() -> list[dict[str, Any]]:
            out = []
            for job_id, label in labels.items():
                j = await client.job(job_id)
                runs = await client.store.list_executions(job_id)
                out.append(
                    {
                        "label": label,
                        "agent": j.agent,
                        "state": j.state.value,
                        "epoch": j.epoch,
                        "owner": h.name_of(j.owner),
                        "created": j.created_at - h.t0,
                        "started": None if j.execution_started_at is None else j.execution_started_at - h.t0,
                        "finished": None if j.finished_at is None else j.finished_at - h.t0,
                        "runs": [
                            {
                                "worker": h.name_of(r.worker_id),
                                "epoch": r.epoch,
                                "outcome": r.outcome,
                                "start": r.started_at - h.t0,
                                "end": None if r.ended_at is None else r.ended_at - h.t0,
                            }
                            for r in runs
                        ],
                    }
                )
            return out

        async def until(what: str, probe: Any, limit_s: float = 20.0) -> Any:
            deadline = time.monotonic() + limit_s
            while True:
                got = await probe()
                emit("sample", t=h.t(), jobs=await snapshot())
                if got:
                    return got
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for {what}")
                await asyncio.sleep(0.2)

        # 1. W1 gets busy with a long job (only W1 offers `w1`).
        long_id = (await client.submit("lab_sleep", {"seconds": LONG_S}, requires=["w1"])).job.id
        labels[long_id] = "long"
        emit("event", t=h.t(), text=f"a {LONG_S:g} s job for W1")
        await until("W1 to start the long job", lambda: _running(client, long_id))
        # 2. Short jobs arrive while W1 is busy: each starts on an idle worker, none waits for W1.
        waits = []
        for i in range(short_jobs):
            job_id = (await client.submit("lab_sleep", {"seconds": 0.3})).job.id
            labels[job_id] = f"short-{i + 1}"
            job = await until(f"short-{i + 1} to finish", lambda j=job_id: _finished(client, j))
            waits.append(
                (
                    (job.execution_started_at or job.created_at) - job.created_at,
                    h.name_of(_last_worker(await client.store.list_executions(job_id))),
                )
            )
            await asyncio.sleep(0.15)
        ran_on = sorted({w for _, w in waits if w})
        emit(
            "event",
            t=h.t(),
            text=f"{short_jobs} short jobs ran on {', '.join(ran_on)}; the longest queue wait was "
            f"{max(w for w, _ in waits) * 1000:.0f} ms (W1 was busy the whole time)",
        )
        # 3. A pre-start freeze: W2 busy for 3 s, so the idle W3 claims the victim and freezes before its start.
        hold = (await client.submit("lab_sleep", {"seconds": 3.0}, requires=["w2"])).job.id
        labels[hold] = "w2-busy"
        await until("W2 to start its job", lambda: _running(client, hold))
        victim = (await client.submit("lab_victim", {"seconds": 0.3})).job.id
        labels[victim] = "victim"
        first = await until("W3 to claim the victim", lambda: _claimed_by(client, victim, w3.worker_id))
        emit(
            "event",
            t=h.t(),
            text=f"W3 claimed the victim at epoch {first.epoch} and froze before its start CAS "
            "(SIGSTOP from the fault hook): its heartbeats stop, its claim will expire",
            epoch=first.epoch,
        )
        done = await until("the victim to run elsewhere", lambda: _finished(client, victim), 30)
        runs = await client.store.list_executions(victim)
        winner = h.name_of(_last_worker(runs))
        emit(
            "event",
            t=h.t(),
            text=f"the claim expired and {winner} claimed the victim at epoch {done.epoch} "
            f"(was {first.epoch}) and ran it: {done.state.value}",
            epoch=done.epoch,
        )
        # 4. W3 wakes up: its start CAS carries the old epoch and token and matches no row.
        w3.signal(signal.SIGCONT)
        refused = await until("W3's late start to be refused", lambda: _log_says(w3.log_path, "matched no row"), 15)
        emit(
            "event",
            t=h.t(),
            text=f"W3 woke up and tried to start the job at epoch {first.epoch}: the start CAS matched no row (refused)",
            line=refused[:300],
        )
        history = await client.events(victim)
        old = [e for e in history if e.epoch == first.epoch]
        emit("sample", t=h.t(), jobs=await snapshot())
        emit(
            "result",
            text=f"Short jobs never waited for the busy W1: they started on idle workers ({', '.join(ran_on)}). The "
            f"victim's claim moved from W3 (epoch {first.epoch}, frozen before its start) to {winner} (epoch "
            f"{done.epoch}), which ran it once; W3's late start was refused, and the history holds "
            f"{len(old)} event(s) of epoch {first.epoch}.",
            epochs=[first.epoch, done.epoch],
            refused=True,
            old_epoch_events=len(old),
        )
        await client.store.cancel(long_id)


def _last_worker(runs: list[Any]) -> str | None:
    return runs[-1].worker_id if runs else None


async def _running(client: Any, job_id: str) -> Any:
    j = await client.job(job_id)
    return j if j.state is JobState.RUNNING else None


async def _finished(client: Any, job_id: str) -> Any:
    j = await client.job(job_id)
    return j if j.state.terminal else None


async def _claimed_by(client: Any, job_id: str, worker_id: str | None) -> Any:
    j = await client.job(job_id)
    return j if j.owner == worker_id and j.state is JobState.QUEUED else None


async def _log_says(path: Any, text: str) -> str | None:
    def read() -> str | None:
        try:
            for line in path.read_text(errors="replace").splitlines():
                if text in line:
                    return str(line)
        except OSError:
            return None
        return None

    return await asyncio.to_thread(read)
