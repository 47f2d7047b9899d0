"""The claim's cost against a backlog (issue 13): claim → start → finish per job of agent `b` / tenant `b` while N
jobs of another agent (`--of agent`) or of another tenant (`--of tenant`) sit queued in front of them.

    .venv/bin/python bench/backlog.py --sizes 1000,100000 --of tenant
    .venv/bin/python bench/backlog.py --sizes 1000,100000,1000000 --of agent \
        --database-url postgresql://postgres@127.0.0.1:5432/test

The backlog is inserted before the clock starts: on SQLite (or with `--fill admission`) through the store's own
enqueue, in batches of 1,000 as admission would; on PostgreSQL by default (`--fill fast`) by a few
`INSERT INTO jobs ... SELECT ... FROM unnest(...)` statements of up to 250,000 rows each, which write the rows
`enqueue_jobs` writes for the same requests (every column from one `Admission.build` template, ids made by
`new_id`, each input's fingerprint, `fair_at` by `enqueue_jobs`'s tenant-turn rule; sampled rows are checked
against `Admission.build`), then `ANALYZE jobs`. The timed jobs of tenant `b` always go through admission; then the
table is vacuumed and checkpointed, off the clock (the fill's autovacuum and checkpoint otherwise land in the timed
loop). Then one worker-like loop claims and starts (`claim_and_start`, limit 4) and finishes `--jobs` no-op jobs of agent `b`
(whichever tenant's the claim hands it), and the mean cost per job is printed, one line per size. With `--of
tenant` the backlog is tenant `a`'s jobs of agent `b` (the worker may claim both; fair shares put `b`'s jobs in
turn); with `--of agent` it is tenant `b`'s jobs of agent `a`, which this worker does not serve. A PostgreSQL URL
names a server: a schema of its own is created there and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg

from tenure.app import open_backends
from tenure.backends._queries import load_queries
from tenure.contracts.states import JobState
from tenure.contracts.store import JobStore
from tenure.contracts.types import AgentSpec, Finish, NewJob, new_id
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings

AGENTS = {"a": AgentSpec("a"), "b": AgentSpec("b")}


@contextlib.asynccontextmanager
async def database(url: str | None) -> AsyncIterator[str]:
    if url is None:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/backlog.db"
        return
    schema = f"backlog_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}?search_path={schema}"
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()


async def fill(store: JobStore, admission: Admission, n: int, agent: str, tenant: str) -> None:
    for start in range(0, n, 1000):
        await store.enqueue(
            [admission.build(JobRequest(agent, i, tenant=tenant)) for i in range(start, min(n, start + 1000))]
        )


FAST_CHUNK = 250_000

# The rows of `enqueue_jobs` for the requests `JobRequest(agent, i, tenant=tenant)`, i = $8 + ordinality - 1: every
# column but the id and the input is the template's (`Admission.build` of one of them), the input is i, the
# fingerprint is that of i's defining list ($18 || input || $19, as `Admission.build` serialises it), and fair_at
# is `enqueue_jobs`'s turn rule for one (tenant, priority) group: one step after the tenant's last claimable turn
# at that priority, never before the head of the line, then one step per row.
FAST_FILL = """
WITH turn AS MATERIALIZED (
    SELECT greatest((SELECT max(t.fair_at) FROM jobs AS t
                      WHERE t.tenant = $2 AND t.priority = $5 AND t.state = 'queued'
                        AND t.owner IS NULL AND NOT t.key_wait) + $17,
                    coalesce((SELECT h.fair_at FROM jobs AS h
                               WHERE h.priority = $5 AND h.state = 'queued' AND h.owner IS NULL AND NOT h.key_wait
                               ORDER BY h.priority DESC, h.fair_at, h.id LIMIT 1), 0)) AS start
)
INSERT INTO jobs (id, tenant, agent, input, priority, requires, idem_digest, request_fingerprint,
                  deadline, max_attempts, timeout_s, retry_safe, concurrency_key, key_limit, key_wait,
                  mode_requested, mode_effective, degraded_reason, fair_at)
SELECT u.id, $2, $3, ($8 + u.ord - 1)::text::json, $5, string_to_array($6, ','), NULL,
       sha256(convert_to($18 || ($8 + u.ord - 1)::text || $19, 'UTF8')),
       now() + make_interval(secs => $9), $10, $11, $12, $13, $14, $15, $4, $7, $16,
       turn.start + (u.ord - 1) * $17
  FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, ord), turn
"""


def _defining(j: NewJob, input_json: str) -> str:
    """The JSON `Admission.build` hashes into a job's fingerprint (no concurrency key, no budget)."""
    return json.dumps([j.agent, input_json, j.priority, sorted(j.requires), j.deadline_s, j.max_attempts])


async def fill_fast(url: str, admission: Admission, n: int, agent: str, tenant: str) -> None:
    """`fill`'s rows on PostgreSQL without admission's round trips (see FAST_FILL), then `ANALYZE jobs`."""
    t = admission.build(JobRequest(agent, 0, tenant=tenant))
    assert t.concurrency_key is None and t.idem_digest is None and t.budget_json is None and t.input_json == "0"
    assert hashlib.sha256(_defining(t, "0").encode()).digest() == t.request_fingerprint
    head, tail = _defining(t, "\x00").split('"\\u0000"')
    conn = await asyncpg.connect(url.split("?")[0], server_settings={"search_path": url.split("search_path=")[1]})
    try:
        for start in range(0, n, FAST_CHUNK):
            ids = [new_id() for _ in range(min(n, start + FAST_CHUNK) - start)]
            await conn.execute(
                FAST_FILL, ids, t.tenant, t.agent, t.mode_requested, t.priority, ",".join(t.requires), t.mode_effective,
                start, t.deadline_s, t.max_attempts, t.timeout_s, t.retry_safe, t.concurrency_key, t.key_limit, False,
                t.degraded_reason, t.fair_step, head + '"', '"' + tail,
            )  # fmt: skip
        await conn.execute("ANALYZE jobs")
        for i in sorted({0, n // 2, n - 1}):  # the rows are admission's rows
            row = await conn.fetchrow(
                "SELECT request_fingerprint, input::text FROM jobs WHERE input::text = $1 AND agent = $2 AND tenant = $3",
                str(i), agent, tenant,
            )  # fmt: skip
            want = admission.build(JobRequest(agent, i, tenant=tenant))
            assert bytes(row["request_fingerprint"]) == want.request_fingerprint and row["input"] == want.input_json, i
    finally:
        await conn.close()


def cte_body(sql: str, name: str) -> str:
    """The body of the common table expression `name` of `sql` (`WITH name AS (...)`), without its parentheses:
    for a read of what a statement would select (an EXPLAIN of a claim's candidates) that cannot drift from it."""
    start = re.search(rf"\b{re.escape(name)} AS (?:MATERIALIZED )?\(", sql)
    if start is None:
        raise ValueError(f"no CTE {name!r} in the statement")
    depth, i = 1, start.end()
    while depth:
        if i >= len(sql):
            raise ValueError(f"the CTE {name!r} is not closed")
        depth += {"(": 1, ")": -1}.get(sql[i], 0)
        i += 1
    return sql[start.end() : i - 1]


# The claim's candidate read (claim_jobs, and pg_temp.tenure_claim_start's first statement), for --explain.
def candidates_sql() -> str:
    """The claim's candidate read, as the store runs it: the `candidates` CTE of queries.sql `claim_jobs` (the same
    text as pg_temp.tenure_claim_start's, tests/unit/test_misc.py), $1 worker, $2 agents, $3 capabilities, $4 limit."""
    return cte_body(load_queries("tenure.backends.postgres")["claim_jobs"], "candidates")


def function_settings() -> list[str]:
    """The planner settings pg_temp.tenure_claim_start runs its statements under (its `SET` clauses)."""
    fn = load_queries("tenure.backends.postgres")["claim_start_function"]
    header = fn[fn.index("LANGUAGE plpgsql") : fn.index("AS $fn$")]
    return re.findall(r"SET (\w+ = \w+)", header)


async def explain(url: str) -> None:
    """Print EXPLAIN (ANALYZE, BUFFERS) of the claim's candidate read as the claim function plans it (a generic
    plan under its settings) and as a custom plan for these values, in a transaction rolled back."""
    conn = await asyncpg.connect(url.split("?")[0], server_settings={"search_path": url.split("search_path=")[1]})
    try:
        modes = {"function": function_settings(), "custom": ["plan_cache_mode = force_custom_plan"]}
        for mode, settings in modes.items():
            with contextlib.suppress(_Rollback):
                async with conn.transaction():
                    for setting in settings:
                        await conn.execute(f"SET LOCAL {setting}")
                    await conn.execute(f"PREPARE candidates(text, text[], text[], int4) AS {candidates_sql()}")
                    rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) EXECUTE candidates('w', '{b}', '{}', 4)")
                    await conn.execute("DEALLOCATE candidates")
                    for r in rows:
                        print(f"explain {mode}: {r[0]}", flush=True)
                    raise _Rollback
    finally:
        await conn.close()


class _Rollback(Exception):
    pass


async def gate_counts(store: JobStore) -> None:
    """Time admission's read behind the backlog (`admission_state`, p50 of 50): counted whole, as before migration
    0015 / the bounded SQLite statement, and up to the default cap + 1, as the gate asks."""
    for label, upto in (("whole", None), ("upto 501", 501)):
        times = []
        for _ in range(50):
            began = time.perf_counter()
            await store.admission_state("b", "agent:b", 3, 600.0, 60.0, upto)
            times.append(time.perf_counter() - began)
        print(f"backlog: gate count {label}: p50 {sorted(times)[25] * 1000:.3f} ms", flush=True)


async def run(url: str, size: int, of: str, jobs: int, how: str, explain_at: bool, gate: bool = False) -> float:
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    try:
        admission = Admission(store, AGENTS)
        agent, tenant = ("b", "a") if of == "tenant" else ("a", "b")
        began = time.perf_counter()
        if how == "fast":
            await fill_fast(url, admission, size, agent, tenant)
        else:
            await fill(store, admission, size, agent, tenant)
        print(f"backlog: filled {size} ({how}) in {time.perf_counter() - began:.1f} s", flush=True)
        await fill(store, admission, jobs, "b", "b")
        if url.startswith("postgres"):
            # Off the clock: the fill's aftermath. An insert-only table of a million rows draws an autovacuum (and
            # the fill's WAL a checkpoint) that otherwise lands in the timed loop: the same 1,000,000-row run
            # measured 0.69 and 1.65 ms per job depending on where they fell. Vacuumed and checkpointed first, the
            # loop times the claim, start and finish against the backlog, not the backlog's own upkeep.
            conn = await asyncpg.connect(url.split("?")[0], server_settings={"search_path": url.split("search_path=")[1]})
            await conn.execute("VACUUM (ANALYZE) jobs")
            await conn.execute("CHECKPOINT")
            await conn.close()
        if gate:
            await gate_counts(store)
        done, paused = 0, 0.0
        began = time.perf_counter()
        while done < jobs:
            if explain_at and done >= jobs // 2:  # halfway through, off the clock
                explain_at, t = False, time.perf_counter()
                await explain(url)
                paused = time.perf_counter() - t
            pairs = await store.claim_and_start("bench", ["b"], [], 4, 30.0)
            finishes = [Finish(c.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, "null", None, None, 0.0)
                        for c, s in pairs]  # fmt: skip
            await store.finish("bench", finishes)
            done += len(pairs)  # with --of tenant, fair shares interleave a's jobs with b's: every job counts
            if not pairs:
                raise SystemExit("backlog: the claim found nothing to do")
        return (time.perf_counter() - began - paused) / jobs
    finally:
        await backends.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,100000", help="backlog sizes, comma-separated")
    parser.add_argument("--of", choices=["agent", "tenant"], default="tenant")
    parser.add_argument("--jobs", type=int, default=400, help="jobs of agent b / tenant b timed per size")
    parser.add_argument("--database-url", help="a PostgreSQL server (default: a SQLite file)")
    parser.add_argument(
        "--fill", choices=["fast", "admission"], help="how the backlog is inserted (default: fast on PostgreSQL)"
    )
    parser.add_argument(
        "--gate", action="store_true", help="also time admission's count behind the backlog, whole and up to 501"
    )
    parser.add_argument(
        "--explain", action="store_true", help="PostgreSQL: EXPLAIN (ANALYZE, BUFFERS) the claim's read halfway through"
    )
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        async with database(args.database_url) as url:
            how = args.fill or ("fast" if args.database_url else "admission")
            if how == "fast" and not args.database_url:
                raise SystemExit("backlog: --fill fast needs PostgreSQL (--database-url)")
            cost = await run(url, size, args.of, args.jobs, how, args.explain and bool(args.database_url), args.gate)
        dialect = "postgres" if args.database_url else "sqlite"
        print(f"backlog: {dialect} of={args.of} queued={size} per_job_ms={cost * 1000:.3f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
