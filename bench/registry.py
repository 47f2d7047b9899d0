"""What knowing agents from the live registry costs admission (docs/routing.md), at 10, 100 and 1,000 live workers.

    .venv/bin/python bench/registry.py [--database-url postgresql://...] [--admits 300]

For each registry size it prints: one read of the registry (`registry_agents`, what `AgentDirectory` does at most
every 2 s per process), and the per-admit cost (median of 10 interleaved rounds) of a job whose agent the app
defines (no registry read) against one known only from the registry (served from the cached snapshot), both
through `Admission.admit` on one store.
No jobs are run; each size uses a fresh SQLite file or PostgreSQL schema.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _scratch import scratch_url

from tenure.app import open_backends
from tenure.contracts.profile import specs_json
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, JobRequest
from tenure.control.gate import GateConfig
from tenure.settings import Settings

AGENTS_PER_WORKER = 8


async def run(url: str, workers: int, admits: int) -> dict[str, float]:
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    try:
        for i in range(workers):  # 100 distinct agents across the fleet, 8 per worker
            names = tuple(f"agent-{(i * AGENTS_PER_WORKER + k) % 100}" for k in range(AGENTS_PER_WORKER))
            specs = {n: AgentSpec(n, timeout_s=60.0) for n in names}
            await store.register_worker(WorkerInfo(f"w-{i}", "h", i, 4, names, agent_specs=specs_json(specs)))
        reads = []
        for _ in range(20):
            t0 = time.perf_counter()
            await store.registry_agents()
            reads.append(time.perf_counter() - t0)
        caps = GateConfig(max_queued=10**7, max_queued_per_tenant=10**7)
        door = Admission(store, {"local": AgentSpec("local")}, gate=caps)
        out = {"read_ms": statistics.median(reads) * 1000}
        await door.admit(JobRequest("agent-7", {}))  # warm: the first registry read happens here
        took: dict[str, list[float]] = {"app_ms": [], "registry_ms": []}
        rounds = 10
        for r in range(rounds):  # interleaved rounds, alternating which goes first: the store grows meanwhile
            pairs = [("app_ms", "local"), ("registry_ms", "agent-7")]
            for label, agent in pairs if r % 2 == 0 else pairs[::-1]:
                t0 = time.perf_counter()
                for _ in range(admits // rounds):
                    await door.admit(JobRequest(agent, {"x": 1}))
                took[label].append((time.perf_counter() - t0) / (admits // rounds) * 1000)
        out.update({label: statistics.median(v) for label, v in took.items()})
        out["reads_during_admits"] = float(door.directory.reads)
        return out
    finally:
        await backends.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", help="a PostgreSQL server URL (default: SQLite files)")
    p.add_argument("--admits", type=int, default=300)
    args = p.parse_args()
    print(f"{'workers':>8}  {'registry read':>14}  {'admit, app agent':>17}  {'admit, registry agent':>22}  reads")
    for n in (10, 100, 1000):
        async with scratch_url(args.database_url) as url:
            r = await run(url, n, args.admits)
        print(
            f"{n:>8}  {r['read_ms']:>11.2f} ms  {r['app_ms']:>14.3f} ms  {r['registry_ms']:>19.3f} ms  "
            f"{int(r['reads_during_admits']):>5}"
        )


if __name__ == "__main__":
    asyncio.run(main())
