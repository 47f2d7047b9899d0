"""The `tenure` command line. Every read command accepts `--json`; errors print their chain of causes in one
paragraph and exit non-zero (2 for bad usage or configuration, 1 for everything else)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tenure.app import LocalClient, connect, load_app, open_quotas, open_ready_index, open_store
from tenure.contracts.errors import ConfigError, InvalidRequest, TenureError
from tenure.contracts.states import JobState
from tenure.contracts.types import Job
from tenure.settings import Settings

log = logging.getLogger("tenure.cli")


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings.from_env(
        database_url=getattr(args, "database_url", None), app=getattr(args, "app", None), **extra
    )


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _out(args: argparse.Namespace, data: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        human()


def _ts(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def _print_job(job: Job) -> None:
    print(f"job        {job.id}")
    print(f"agent      {job.agent}  (tenant {job.tenant}, priority {job.priority})")
    print(f"state      {job.state.value}  epoch {job.epoch}  attempts {job.attempts}/{job.max_attempts}")
    print(f"owner      {job.owner or '-'}  execution {job.execution_id or '-'}")
    print(f"created    {_ts(job.created_at)}  started {_ts(job.execution_started_at)}  finished {_ts(job.finished_at)}")
    if job.error_code:
        print(f"error      {job.error_code}: {job.error_message}")
    if job.result is not None:
        print(f"result     {json.dumps(job.result)}")


def _read_input(text: str) -> Any:
    if text == "-":
        raw = sys.stdin.read()
        source = "standard input"
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidRequest(f"cannot read input file {text[1:]!r}: {exc.strerror}") from exc
        source = text[1:]
    else:
        raw, source = text, "--input"
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{source} is not valid JSON: {exc}") from exc


# -- commands ---------------------------------------------------------------------------------------------------------
async def cmd_migrate(args: argparse.Namespace) -> int:
    store = await open_store(_settings(args), migrate=False)
    try:
        before = await store.schema_version()
        after = await store.migrate()
    finally:
        await store.close()
    _out(args, {"from": before, "to": after}, lambda: print(f"schema at version {after} (was {before})"))
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from tenure.worker import Worker, WorkerConfig
    from tenure.backends.sqlite import SqliteStore
    from tenure.worker.faults import Faults, stop_self

    settings = _settings(
        args, concurrency=args.concurrency, heartbeat_s=args.heartbeat_s, claim_ttl_s=args.claim_ttl_s,
        capabilities=tuple(args.capabilities.split(",")) if args.capabilities else None,
    )
    app = load_app(settings.app)
    faults = Faults.parse(settings.faults)
    config = WorkerConfig(
        concurrency=settings.concurrency, heartbeat_s=settings.heartbeat_s, claim_ttl_s=settings.claim_ttl_s,
        sweep_interval_s=settings.sweep_interval_s, drain_timeout_s=settings.drain_timeout_s,
        poll_s=settings.poll_s, capabilities=settings.capabilities,
    )
    store = await open_store(settings)
    if isinstance(store, SqliteStore):
        sqlite_store = store

        async def freeze() -> None:
            await sqlite_store.run_between_transactions(stop_self)

        faults.freeze = freeze
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if stop.is_set():  # a second signal: stop waiting for running jobs
            log.warning("second %s: exiting without waiting", signal.Signals(signum).name)
            if main is not None:
                main.cancel()
            return
        log.info("%s: draining (send again to exit now)", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    ready = open_ready_index(settings, config.claim_ttl_s)
    try:
        async with open_quotas(settings, store, config.claim_ttl_s) as quotas:
            await Worker(store, app, config, faults=faults, quotas=quotas, ready_index=ready).run(stop)
    finally:
        if ready is not None:
            await ready.close()
        await store.close()
    return 0


async def _with_client(args: argparse.Namespace, fn: Callable[[LocalClient], Awaitable[int]]) -> int:
    async with connect(settings=_settings(args)) as client:
        return await fn(client)


async def cmd_submit(args: argparse.Namespace) -> int:
    payload = _read_input(args.input)

    async def go(client: LocalClient) -> int:
        job_id = await client.submit(
            args.agent, payload, idempotency_key=args.idempotency_key, priority=args.priority,
            requires=args.requires.split(",") if args.requires else (), deadline_s=args.deadline_s,
            max_attempts=args.max_attempts,
        )
        if not args.wait:
            _out(args, {"id": job_id}, lambda: print(job_id))
            return 0
        job = await client.wait(job_id, args.timeout)
        _out(args, job.to_dict(), lambda: _print_job(job))
        return 0 if job.state is JobState.SUCCEEDED else 1

    return await _with_client(args, go)


async def cmd_jobs(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        state = JobState(args.state) if args.state else None
        jobs = await client.jobs(state=state, agent=args.agent, limit=args.limit, before=args.before)

        def human() -> None:
            print(f"{'ID':36}  {'AGENT':18}  {'STATE':9}  {'EPOCH':>5}  {'ATT':>5}  {'CREATED':12}  ERROR")
            for j in jobs:
                err = f"{j.error_code}: {j.error_message}" if j.error_code else ""
                print(f"{j.id:36}  {j.agent:18.18}  {j.state.value:9}  {j.epoch:>5}  "
                      f"{j.attempts:>2}/{j.max_attempts:<2}  {_ts(j.created_at):12}  {err}")

        _out(args, [j.to_dict() for j in jobs], human)
        return 0

    return await _with_client(args, go)


async def cmd_job(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        job = await client.job(args.id)
        executions = await client.store.list_executions(job.id)
        data = job.to_dict() | {"executions": [e.__dict__ if hasattr(e, "__dict__") else _slots(e) for e in executions]}

        def human() -> None:
            _print_job(job)
            for e in executions:
                print(f"execution  {e.id}  epoch {e.epoch}  {e.outcome:9}  worker {e.worker_id}  "
                      f"{_ts(e.started_at)} → {_ts(e.ended_at)}")

        _out(args, data, human)
        return 0

    return await _with_client(args, go)


def _slots(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


async def cmd_events(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        events = await client.events(args.id, args.after, args.limit)

        def human() -> None:
            for e in events:
                print(f"{e.cursor:>8}  {_ts(e.ts)}  {e.type:20}  {json.dumps(e.payload)}")

        _out(args, [e.to_dict() for e in events], human)
        return 0

    return await _with_client(args, go)


async def cmd_requeue(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        job = await client.requeue(args.id)
        _out(args, job.to_dict(), lambda: print(f"requeued {job.id} ({job.agent}); it is {job.state.value}"))
        return 0

    return await _with_client(args, go)


async def cmd_workers(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        workers = await client.workers(include_gone=args.all)

        def human() -> None:
            print(f"{'ID':40}  {'HOST':16}  {'PID':>7}  {'STATE':9}  {'SLOTS':>5}  {'HEARTBEAT':12}  JOBS HELD")
            for w in workers:
                print(f"{w.id:40}  {w.host:16.16}  {w.pid:>7}  {w.state.value:9}  {w.concurrency:>5}  "
                      f"{_ts(w.last_heartbeat):12}  {len(w.jobs_held)}")

        _out(args, [w.to_dict() for w in workers], human)
        return 0

    return await _with_client(args, go)


# -- parser -------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tenure",
        description="Tenure: a runtime for AI-agent jobs. Durable jobs on SQLite or PostgreSQL, run by a pool "
        "of workers with fenced ownership. Settings come from TENURE_* variables (docs/configuration.md); "
        "flags override them.",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser, *, app: bool = True, json_flag: bool = True) -> None:
        sp.add_argument("--database-url", help="store URL (TENURE_DATABASE_URL; default sqlite:///./tenure.db)")
        if app:
            sp.add_argument("--app", help="the app as module:attribute (TENURE_APP; default tenure.examples:app)")
        if json_flag:
            sp.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sp = sub.add_parser("migrate", help="apply pending schema migrations")
    common(sp, app=False)
    sp.set_defaults(fn=cmd_migrate)

    sp = sub.add_parser("worker", help="run a worker process (SIGTERM drains it)")
    common(sp, json_flag=False)
    sp.add_argument("--concurrency", type=int, help="job slots in this process (TENURE_CONCURRENCY; default 10)")
    sp.add_argument("--capabilities", help="comma-separated capability tags this worker offers")
    sp.add_argument("--heartbeat-s", type=float, help="heartbeat interval (TENURE_HEARTBEAT_S; default 5)")
    sp.add_argument("--claim-ttl-s", type=float, help="claim TTL, at least 3 heartbeats (TENURE_CLAIM_TTL_S)")
    sp.set_defaults(fn=cmd_worker)

    sp = sub.add_parser("submit", help="submit a job")
    common(sp)
    sp.add_argument("agent", help="the agent to run")
    sp.add_argument("--input", default="null", help="input as JSON, @file to read a file, or - for stdin")
    sp.add_argument("--idempotency-key", help="the same key with the same request returns the same job")
    sp.add_argument("--priority", type=int, help="0..100, higher runs first (default 0)")
    sp.add_argument("--requires", help="comma-separated capability tags a worker must have")
    sp.add_argument("--deadline-s", type=float, help="queue deadline: expire if not started within (default 300)")
    sp.add_argument("--max-attempts", type=int, help="executions before the job is dead (default: the agent's)")
    sp.add_argument("--wait", action="store_true", help="wait for the job to finish and print it")
    sp.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")
    sp.set_defaults(fn=cmd_submit)

    sp = sub.add_parser("jobs", help="list jobs, newest first")
    common(sp)
    sp.add_argument("--state", choices=[s.value for s in JobState], help="only jobs in this state")
    sp.add_argument("--agent", help="only jobs of this agent")
    sp.add_argument("--limit", type=int, default=50)
    sp.add_argument("--before", help="page: jobs created before this job id")
    sp.set_defaults(fn=cmd_jobs)

    sp = sub.add_parser("job", help="show one job and its executions")
    common(sp)
    sp.add_argument("id")
    sp.set_defaults(fn=cmd_job)

    sp = sub.add_parser("events", help="print a job's event history")
    common(sp)
    sp.add_argument("id")
    sp.add_argument("--after", help="only events after this cursor (EPOCH-SEQ)")
    sp.add_argument("--limit", type=int, default=10000)
    sp.set_defaults(fn=cmd_events)

    sp = sub.add_parser("requeue", help="put a dead (or failed, lost, expired, cancelled) job back in the queue")
    common(sp)
    sp.add_argument("id")
    sp.set_defaults(fn=cmd_requeue)

    sp = sub.add_parser("demo", help="run the demo on a temporary SQLite file (what `make demo` runs)")
    sp.add_argument("--keep", action="store_true", help="keep the temporary directory afterwards")
    sp.set_defaults(fn=None, sync=lambda a: _demo(a))

    sp = sub.add_parser("mock-model", help="serve the bundled OpenAI-compatible mock model (for tests and demos)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8001)
    sp.add_argument("--max-concurrency", type=int, default=8, help="more requests in flight than this get 429")
    sp.add_argument("--latency-ms", type=float, default=50.0, help="time to the first token")
    sp.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    sp.set_defaults(fn=None, sync=lambda a: _mock_model(a))

    sp = sub.add_parser("workers", help="list registered workers")
    common(sp)
    sp.add_argument("--all", action="store_true", help="include workers that are gone")
    sp.set_defaults(fn=cmd_workers)
    return p


def _demo(args: argparse.Namespace) -> int:
    from tenure.demo import main as demo_main

    return demo_main(["--keep"] if args.keep else [])


def _mock_model(args: argparse.Namespace) -> int:
    from tenure.mock_model import serve

    serve(args.host, args.port, args.max_concurrency, args.latency_ms, args.tokens)
    return 0


def _explain(exc: BaseException) -> str:
    parts, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur) or type(cur).__name__
        if parts and text in parts[-1]:
            pass
        else:
            parts.append(text)
        cur = cur.__cause__ or cur.__context__
    return "; caused by: ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings_level = args.log_level or Settings.from_env().log_level
        _setup_logging(settings_level)
        if args.fn is None:
            return int(args.sync(args))
        return asyncio.run(args.fn(args))
    except ConfigError as exc:
        print(f"tenure: configuration error: {_explain(exc)}", file=sys.stderr)
        return 2
    except TenureError as exc:
        print(f"tenure: {exc.code}: {_explain(exc)}", file=sys.stderr)
        return 1
    except TimeoutError:
        print("tenure: timed out", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tenure jobs --json | head`
        return 0
    except asyncio.CancelledError:
        return 130


if __name__ == "__main__":
    sys.exit(main())
