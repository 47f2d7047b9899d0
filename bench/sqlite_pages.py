"""What one finish-and-claim transaction writes on SQLite, page by page: the WAL frames it appends, by B-tree.

A worker's common path on SQLite is one write transaction per batch (`finish_and_claim`: the finish CAS of the
batch's jobs, then the claim and start CAS of as many new ones), and its cost is the pages that commit writes to
the WAL (bench/README.md, session 14: 6.2 pages per job against 2.6 in session5-base). This replays that
transaction on a backlog of no-op jobs, with the store's own statements (`backends/sqlite/_writes.py`) on a
connection of its own, and reads the page number of every frame each commit appended; `dbstat` names the
table or index each page belongs to.

    .venv/bin/python bench/sqlite_pages.py                       # 10,000 queued, batches of 5, 200 batches
    .venv/bin/python bench/sqlite_pages.py --jobs 50000 --batch 10

Then the same for single submits (`--submits`, through `tenure.connect`, the harness's W2 producer). Prints the
frames per transaction and per job for each B-tree, largest first. Deterministic for a given backlog
and batch size (it counts pages, not time), so it can be compared across checkouts on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sqlite3
import struct
import tempfile

import tenure
from tenure.contracts.states import JobState
from tenure.contracts.types import Finish
from tenure.settings import Settings

try:
    from tenure.backends.sqlite._writes import claim_and_start_in, finish_in
except ImportError:  # older checkouts (session5-base): the same functions, in the store's module
    from tenure.backends.sqlite.store import _claim_and_start_in as claim_and_start_in
    from tenure.backends.sqlite.store import _finish_in as finish_in

app = tenure.Tenure()


@app.agent("noop")
async def noop(ctx: tenure.Context, input: dict) -> None:
    return None


WAL_HEADER = 32
FRAME_HEADER = 24


def settings_of(url: str) -> Settings:
    make = getattr(Settings, "of", Settings)  # Settings.of since issue 11
    return make(database_url=url, max_queued=10**9, max_queued_per_tenant=10**9)


async def enqueue(url: str, jobs: int) -> None:
    async with tenure.connect(app, settings=settings_of(url)) as client:
        for i in range(0, jobs, 1000):
            await client.submit_many([tenure.JobRequest("noop", {"i": j}) for j in range(i, min(jobs, i + 1000))])


def frames_since(wal: str, offset: int, page_size: int) -> tuple[list[int], int]:
    """The page numbers of the WAL frames from byte `offset` on, and the offset after them."""
    pages = []
    offset = max(offset, WAL_HEADER)  # a WAL restarted from empty: its frames begin after its header
    with open(wal, "rb") as f:
        f.seek(offset)
        while True:
            header = f.read(FRAME_HEADER)
            if len(header) < FRAME_HEADER:
                break
            pages.append(struct.unpack(">I", header[:4])[0])
            f.seek(page_size, os.SEEK_CUR)
            offset += FRAME_HEADER + page_size
    return pages, offset


def name_pages(db: sqlite3.Connection, pages: list[int], into: collections.Counter[str]) -> None:
    """Count `pages` by the B-tree `dbstat` says each belongs to."""
    marks = ",".join("?" * len(pages))
    names = dict(db.execute(f"SELECT pageno, name FROM dbstat WHERE pageno IN ({marks})", pages))
    for p in pages:
        into[names.get(p, "(free or overflow)")] += 1


async def submit_each(url: str, n: int, db: sqlite3.Connection, page_size: int) -> collections.Counter[str]:
    """`n` single submits through `tenure.connect` (the harness's W2 producer), each one transaction: the frames
    of each, by B-tree. Few enough that the client's connection does not checkpoint (and restart) the WAL."""
    by_tree: collections.Counter[str] = collections.Counter()
    wal = url.removeprefix("sqlite:///") + "-wal"
    async with tenure.connect(app, settings=settings_of(url)) as client:
        offset = os.path.getsize(wal)  # noqa: ASYNC240 - a bench, between submits
        for i in range(n):
            await client.submit("noop", {"i": i})
            pages, offset = frames_since(wal, offset, page_size)
            name_pages(db, pages, by_tree)
    return by_tree


def report(what: str, by_tree: collections.Counter[str], n: int, per: int) -> None:
    total = sum(by_tree.values())
    print(f"  {what}: frames per transaction {total / n:.2f}, per job {total / n / per:.2f}")
    for name, count in by_tree.most_common():
        print(f"    {name:28s} {count / n:6.2f} per transaction  {count / n / per:5.2f} per job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000, help="the backlog (default 10,000)")
    parser.add_argument("--batch", type=int, default=5, help="finishes and claims per transaction (default 5)")
    parser.add_argument("--batches", type=int, default=200, help="transactions measured (default 200)")
    parser.add_argument("--submits", type=int, default=50, help="single submits measured after them (default 50)")
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="sqlite-pages-"), "t.db")
    asyncio.run(enqueue(f"sqlite:///{path}", args.jobs))

    db = sqlite3.connect(path, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL keeps every frame of the run
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # (a pending row would hold a read snapshot)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    worker, k = "pages-worker", args.batch

    db.execute("BEGIN IMMEDIATE")
    running = claim_and_start_in(db, worker, ["noop"], [], k, 60.0)
    db.execute("COMMIT")
    wal = path + "-wal"
    offset = os.path.getsize(wal)
    by_tree: collections.Counter[str] = collections.Counter()
    for _ in range(args.batches):
        finishes = [
            Finish(c.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, result_json="null") for c, s in running
        ]
        db.execute("BEGIN IMMEDIATE")
        done = finish_in(db, worker, finishes)
        running = claim_and_start_in(db, worker, ["noop"], [], k, 60.0)
        db.execute("COMMIT")
        assert len(done) == len(finishes) and len(running) == k, "the backlog ran out: raise --jobs"
        pages, offset = frames_since(wal, offset, page_size)
        name_pages(db, pages, by_tree)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # (a pending row would hold a read snapshot)
    submits = asyncio.run(submit_each(f"sqlite:///{path}", args.submits, db, page_size))
    db.close()

    n = args.batches
    print(f"sqlite: {args.jobs} queued, page size {page_size}")
    report(f"{n} transactions of {k} finishes + {k} claims", by_tree, n, k)
    report(f"{args.submits} single submits", submits, args.submits, 1)


if __name__ == "__main__":
    main()
