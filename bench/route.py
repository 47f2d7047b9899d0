"""What weighted routing costs admission (docs/routing.md), at 10, 100 and 1,000 live workers.

    .venv/bin/python bench/route.py [--database-url postgresql://...] [--admits 300] [--json out.json]

For each registry size (fake workers registered through the store's registry API, each with a record written
by the store's heartbeat, a third of them offering the feature `gpu`) it prints:

- the routing decision alone: `RouteChooser.choose` (rank every candidate, choose, serialise the explanation), in µs
  per job, from the cached registry snapshot (no I/O);
- `Admission.admit` of a job preferring `gpu`, per job, with routing on (TENURE_ROUTE_GRACE_MS=200) and off (0),
  medians of 10 interleaved rounds on one store;
- one read of the registry (`registry_agents`, what the snapshot costs at most every 2 s per process).

No jobs are run; each size uses a fresh SQLite file or PostgreSQL schema.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from _scratch import scratch_url

from tenure.app import open_backends
from tenure.contracts.profile import WorkerRecord, specs_json
from tenure.contracts.states import WorkerState
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.gate import GateConfig
from tenure.settings import Settings

AGENT = AgentSpec("route-me", timeout_s=30.0)


async def run(url: str, workers: int, admits: int) -> dict[str, float]:
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    try:
        specs = specs_json({AGENT.name: AGENT})
        for i in range(workers):
            features = ("gpu",) if i % 3 == 0 else ()
            wid = f"w-{i:04d}"
            await store.register_worker(WorkerInfo(wid, "h", i, 64, (AGENT.name,), features=features, agent_specs=specs))
            record = WorkerRecord(0.5 + (i * 37 % 50) / 100, 100.0 + (i * 53 % 100) * 50)
            await store.heartbeat(wid, WorkerState.ACTIVE, i % 4, [], 30.0, record)
        reads = []
        for _ in range(20):
            t0 = time.perf_counter()
            await store.registry_agents()
            reads.append(time.perf_counter() - t0)
        caps = GateConfig(max_queued=10**7, max_queued_per_tenant=10**7)
        on = Admission(store, {}, AdmissionLimits(route_grace_ms=200), gate=caps)
        off = Admission(store, {}, AdmissionLimits(route_grace_ms=0), gate=caps)
        req = JobRequest(AGENT.name, {"x": 1}, prefers=["gpu"])
        await on.admit(req)  # warm: the registry snapshot is read here
        await off.admit(req)
        spec = on.spec(AGENT.name)
        assert spec is not None
        need, wanted = frozenset(), frozenset({"gpu"})
        decisions = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                on.directory.routed.clear()  # each decision against the same snapshot: no slot filled up
                on.chooser._quiet.clear()  # and made anew: a remembered one (a near tie, say) is a dict lookup
                on.chooser.choose(spec, need, wanted, False)
            decisions.append((time.perf_counter() - t0) / 200)
        took: dict[str, list[float]] = {"on": [], "off": []}
        rounds = 10
        for r in range(rounds):  # interleaved, alternating which goes first: the store grows meanwhile
            pairs = [("on", on), ("off", off)]
            for label, door in pairs if r % 2 == 0 else pairs[::-1]:
                t0 = time.perf_counter()
                for _ in range(admits // rounds):
                    await door.admit(req)
                took[label].append((time.perf_counter() - t0) / (admits // rounds))
        return {
            "workers": float(workers),
            "decision_us": statistics.median(decisions) * 1e6,
            "admit_on_us": statistics.median(took["on"]) * 1e6,
            "admit_off_us": statistics.median(took["off"]) * 1e6,
            "read_ms": statistics.median(reads) * 1000,
            "reads_during_admits": float(on.directory.reads),
        }
    finally:
        await backends.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", help="a PostgreSQL server URL (default: SQLite files)")
    p.add_argument("--admits", type=int, default=300)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    print(f"{'workers':>8}  {'decision':>10}  {'admit, routing on':>18}  {'admit, routing off':>19}  {'registry read':>14}")
    results = []
    for n in (10, 100, 1000):
        async with scratch_url(args.database_url) as url:
            r = await run(url, n, args.admits)
        results.append(r)
        print(
            f"{n:>8}  {r['decision_us']:>7.1f} µs  {r['admit_on_us']:>15.0f} µs  {r['admit_off_us']:>16.0f} µs  "
            f"{r['read_ms']:>11.2f} ms"
        )
    if args.json:
        doc = {"backend": "postgres" if args.database_url else "sqlite", "results": results}
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(doc, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
