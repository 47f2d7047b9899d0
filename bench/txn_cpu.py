"""The CPU one finish-and-claim transaction costs on SQLite, and what each index adds to it.

A SQLite worker's common path is one write transaction per batch (`finish_and_claim`: the finish CAS of the
batch's jobs, then the claim and start CAS of as many new ones). This replays that transaction on a backlog of
no-op jobs with the store's own statements (`backends/sqlite/_writes.py`) and times each one with
`time.thread_time()`: CPU of this thread only, so neither the fsync's wait nor the rest of the machine is
counted, and the medians of two checkouts can be compared on a noisy machine (`bench/sqlite_pages.py` counts
the pages the same transaction writes). Before each transaction a second connection commits, as the other
worker of a two-worker drain does, so every transaction starts with its page cache out of date (`--no-reset`
leaves it warm).

    .venv/bin/python bench/txn_cpu.py                              # 1,000 transactions of 10 + 10
    .venv/bin/python bench/txn_cpu.py --drop jobs_done_state       # the same without one index
    .venv/bin/python bench/txn_cpu.py --each jobs_finished,jobs_tenant_turn   # without each in turn
    (cd ../base && .venv/bin/python ../main/bench/txn_cpu.py --temp-store FILE)   # an older checkout (session5-base)

Prints the median and mean CPU per transaction and per job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sqlite_pages import claim_and_start_in, enqueue, finish_in

from tenure.contracts.states import JobState
from tenure.contracts.types import Finish


def measure(path: str, args: argparse.Namespace, drop: list[str]) -> list[float]:
    """CPU seconds of each of `args.batches` transactions, on a copy of the backlog without the `drop` indexes."""
    db = sqlite3.connect(path, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {args.synchronous}")
    db.execute(f"PRAGMA temp_store = {args.temp_store}")
    for name in drop:
        db.execute(f"DROP INDEX {name}")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE IF NOT EXISTS bench_bump (n INTEGER)")
    other.execute("INSERT INTO bench_bump VALUES (0)")
    worker, k = "txn-cpu-worker", args.batch
    db.execute("BEGIN IMMEDIATE")
    running = claim_and_start_in(db, worker, ["noop"], [], k, 60.0)
    db.execute("COMMIT")
    cpu = []
    for _ in range(args.batches):
        if args.reset:
            other.execute("UPDATE bench_bump SET n = n + 1")  # another connection's commit: our cache is stale
        finishes = [
            Finish(c.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, result_json="null") for c, s in running
        ]
        t0 = time.thread_time()
        db.execute("BEGIN IMMEDIATE")
        done = finish_in(db, worker, finishes)
        running = claim_and_start_in(db, worker, ["noop"], [], k, 60.0)
        db.execute("COMMIT")
        cpu.append(time.thread_time() - t0)
        assert len(done) == len(finishes) and len(running) == k, "the backlog ran out: raise --jobs"
    db.close()
    other.close()
    return cpu


def report(what: str, cpu: list[float], k: int) -> None:
    med, mean = statistics.median(cpu), statistics.mean(cpu)
    print(f"  {what:40s} median {med * 1e6:7.0f} us  mean {mean * 1e6:7.0f} us  per job {mean * 1e6 / k:6.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30_000, help="the backlog (default 30,000)")
    parser.add_argument("--batch", type=int, default=10, help="finishes and claims per transaction (default 10)")
    parser.add_argument("--batches", type=int, default=1000, help="transactions measured (default 1,000)")
    parser.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"), help="(default FULL)")
    parser.add_argument(
        "--temp-store",
        default="MEMORY",
        choices=("MEMORY", "FILE"),
        help="as the store sets it (default MEMORY; FILE before session 17)",
    )
    parser.add_argument("--no-reset", dest="reset", action="store_false", help="no other commit in between")
    parser.add_argument("--drop", default="", help="indexes to drop first, comma-separated")
    parser.add_argument("--each", default="", help="indexes to drop one at a time (a run each, after a plain run)")
    args = parser.parse_args()
    src = os.path.join(tempfile.mkdtemp(prefix="txn-cpu-"), "t.db")
    asyncio.run(enqueue(f"sqlite:///{src}", args.jobs))
    with sqlite3.connect(src) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    runs = [[d for d in args.drop.split(",") if d]]
    runs += [[*runs[0], name] for name in args.each.split(",") if name]
    print(f"sqlite {sqlite3.sqlite_version}: {args.jobs} queued, {args.batches} transactions of {args.batch} + {args.batch}")
    for drop in runs:
        path = src + f".{len(drop)}-{abs(hash(tuple(drop)))}"
        with sqlite3.connect(src) as a, sqlite3.connect(path) as b:
            a.backup(b)  # every run starts from the same backlog
        report("without " + ", ".join(drop) if drop else "all indexes", measure(path, args, drop), args.batch)


if __name__ == "__main__":
    main()
