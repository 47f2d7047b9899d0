"""Lab 3, counter versus lease: holders of a quota crash; the leases recover, a counter would leak.

Three workers with two slots each run `lab_hold` jobs: each takes a slot of the quota `lab:pool` (a lease in the
store's `leases` table, TTL = the claim TTL, 1.5 s), holds it for a second and gives it back; a job drawn at the
crash rate SIGKILLs its own worker while holding the slot, and the lab starts a new worker in its place. Every
250 ms the lab reads the real quota (`Leases.holders`) and works out what a naive counter would say from the
same jobs' events: +1 at `quota.acquired`, -1 at `quota.released`; a crashed holder never sends its -1.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from tenure.control.admission import JobRequest
from tenure.demos.labs._harness import Harness, LabWorker, emit, lab_leases, lab_store

KEY = "lab:pool"
HOLD_S = 1.0
WORKERS = 3
SLOTS = 2


async def run(h: Harness, params: dict[str, Any]) -> None:
    limit, rate, seconds = (
        int(params.get("limit", 4)),
        float(params.get("crash_rate", 0.3)),
        float(params.get("seconds", 20)),
    )
    rng = random.Random(15)
    env = {"TENURE_QUOTAS": f"{KEY}={limit}"}
    emit(
        "info",
        text=f"quota {KEY} = {limit}; {WORKERS} workers × {SLOTS} slots; crash rate {rate:.0%}; "
        f"lease TTL {h.claim_ttl_s:g} s",
        limit=limit,
        ttl_s=h.claim_ttl_s,
    )
    async with lab_store(h) as client, lab_leases(h) as leases:
        workers = [h.spawn(f"W{i + 1}", concurrency=SLOTS, env=env) for i in range(WORKERS)]
        await h.registered(client, workers)
        jobs: list[str] = []
        crashes = 0
        respawned = 0
        started = time.monotonic()
        lease_free: list[int] = []

        async def counter() -> int:
            events = await client.store.read_events_many([(j, None) for j in jobs], 100) if jobs else []
            return sum(1 for e in events if e.type == "quota.acquired") - sum(
                1 for e in events if e.type == "quota.released"
            )

        while time.monotonic() - started < seconds:
            # Keep the quota in use but not full (one slot short), so free capacity is what the chart shows.
            live = 0
            for j in jobs[-40:]:
                if not (await client.job(j)).state.terminal:
                    live += 1
            want = max(1, limit - 1) - live
            if want > 0:
                reqs = []
                for _ in range(want):
                    crash = rng.random() < rate
                    crashes += crash
                    reqs.append(JobRequest("lab_hold", {"seconds": HOLD_S, "crash": crash}))
                jobs += await client.submit_many(reqs)
            # A dead worker is replaced (as a supervisor would), so the fleet keeps its size.
            for i, w in enumerate(workers):
                if not w.alive():
                    respawned += 1
                    workers[i] = _replace(h, w, env)
                    emit(
                        "event",
                        t=h.t(),
                        text=f"{w.name} was SIGKILLed by a job holding a slot (crash {respawned}); started again",
                    )
            held = len(await leases.holders(KEY))
            naive = await counter()
            lease_free.append(limit - held)
            emit(
                "sample",
                t=h.t(),
                lease_free=limit - held,
                counter_free=max(0, limit - naive),
                counter=naive,
                crashes=respawned,
            )
            await asyncio.sleep(0.25)
        # Stop feeding; let everything finish and the dead holders' leases expire.
        emit("event", t=h.t(), text="no new jobs: the quota drains")
        drain_until = time.monotonic() + 15
        while time.monotonic() < drain_until:
            states = [(await client.job(j)).state for j in jobs]
            held = len(await leases.holders(KEY))
            naive = await counter()
            emit(
                "sample",
                t=h.t(),
                lease_free=limit - held,
                counter_free=max(0, limit - naive),
                counter=naive,
                crashes=respawned,
            )
            if all(s.terminal for s in states) and held == 0:
                break
            await asyncio.sleep(0.25)
        held = len(await leases.holders(KEY))
        naive = await counter()
        leaked = naive
        emit(
            "result",
            text=f"{respawned} worker crashes killed {leaked} holders while they held a slot. The lease-backed quota "
            f"has {limit - held} of {limit} slots free again (each dead holder's lease expired within one TTL, "
            f"{h.claim_ttl_s:g} s); a counter would count {leaked} ghost slot(s) and grant "
            f"{max(0, limit - leaked)} of {limit}"
            + (" — the quota is gone, and every worker looks idle." if leaked >= limit else "."),
            crashes=respawned,
            lease_free=limit - held,
            counter_free=max(0, limit - leaked),
            leaked=leaked,
            limit=limit,
            min_lease_free=min(lease_free, default=limit),
        )


def _replace(h: Harness, dead: LabWorker, env: dict[str, str]) -> LabWorker:
    h.workers.remove(dead)
    return h.spawn(dead.name, concurrency=SLOTS, env=env)
