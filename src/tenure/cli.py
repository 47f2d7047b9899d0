"""The `tenure` command line. Every read command accepts `--json`; errors print their chain of causes in one
paragraph and exit non-zero (2 for bad usage or configuration, 1 for everything else)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tenure.app import LocalClient, connect, load_app, open_backends, open_quotas, open_ready_index, worker_config
from tenure.contracts.errors import ConfigError, InvalidRequest, NotFound, TenureError
from tenure.contracts.states import JobState
from tenure.contracts.store import JobStore
from tenure.contracts.types import Event, Job
from tenure.control.admission import parse_json
from tenure.observability.logs import set_process_log_fields, setup_logging
from tenure.settings import Settings

if TYPE_CHECKING:
    from tenure.client import Client

log = logging.getLogger("tenure.cli")


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings.from_env(database_url=getattr(args, "database_url", None), app=getattr(args, "app", None), **extra)


def _setup_logging(level: str, fmt: str = "auto") -> None:
    # Structured logs (docs/observability.md): JSON lines, or a readable line on a terminal.
    setup_logging(level, fmt, sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise for the CLI


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
    """The job input of `--input`: JSON text, `@file` or `-` (standard input), read by the same rules as an HTTP
    body (admission's `parse_json`: strict JSON, Unicode text, bounded nesting), so a bad one is one
    `invalid_request` paragraph, never a traceback. Files and standard input are read as bytes and decoded by
    the parser, which names the source of a byte that is not UTF-8."""
    raw: str | bytes
    if text == "-":
        raw = sys.stdin.buffer.read()
        source = "standard input"
    elif text.startswith("@"):
        try:
            with open(text[1:], "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidRequest(f"cannot read input file {text[1:]!r}: {exc.strerror}") from exc
        source = text[1:]
    else:
        raw, source = text, "--input"
    return parse_json(raw, source)


# -- commands ---------------------------------------------------------------------------------------------------------
async def cmd_migrate(args: argparse.Namespace) -> int:
    backends = await open_backends(_settings(args), migrate=False)
    try:
        before = await backends.jobs.schema_version()
        after = await backends.jobs.migrate()
    finally:
        await backends.close()
    _out(args, {"from": before, "to": after}, lambda: print(f"schema at version {after} (was {before})"))
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from tenure.worker import Worker
    from tenure.worker.faults import Faults, stop_self

    settings = _settings(
        args,
        concurrency=args.concurrency,
        heartbeat_s=args.heartbeat_s,
        claim_ttl_s=args.claim_ttl_s,
        capabilities=tuple(args.capabilities.split(",")) if args.capabilities else None,
    )
    app = load_app(settings.app)
    faults = Faults.parse(settings.faults)
    config = worker_config(settings)
    backends = await open_backends(settings)

    async def freeze() -> None:
        await backends.jobs.run_between_transactions(stop_self)

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
    stop_metrics = None
    try:
        async with open_quotas(settings, backends, config.claim_ttl_s) as quotas:
            worker = Worker(backends, app, config, faults=faults, quotas=quotas, ready_index=ready)
            set_process_log_fields(role="worker", worker_id=worker.id)  # every line of this process, threads too
            metrics_port = args.metrics_port if args.metrics_port is not None else _metrics_port(settings)
            stop_metrics = await _serve_worker_metrics(worker, backends.jobs, metrics_port, args.metrics_host)
            # What exists now (imports, the app, connections) lives as long as the process: frozen out of the
            # collector's generations, it is not traversed by every collection. W2 probe, 4 interleaved pairs:
            # pickup p99 6.45 vs 7.0 ms (medians), p50 lower in every pair.
            gc.freeze()
            await worker.run(stop)
    finally:
        if ready is not None:
            await ready.close()
        await backends.close()
        if stop_metrics is not None:
            await stop_metrics()
    if worker.abandoned:
        # Handlers that ignore cancellation would keep asyncio.run from ever returning (it waits for every
        # task): their jobs are finished and fenced, so the process ends without them.
        log.error("exiting with %d abandoned handlers still running", len(worker.abandoned))
        logging.shutdown()
        os._exit(0)
    return 0


def _metrics_port(settings: Settings) -> int | None:
    text = settings.extra.get("metrics_port")
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"TENURE_METRICS_PORT must be a port number, not {text!r}") from None


async def _serve_worker_metrics(worker: Any, store: JobStore, port: int | None, host: str) -> Callable[[], Awaitable[None]]:
    """`/metrics` of one worker on its own thread (never on the loop); also exports the SQLite store's
    connection thread as a blocking adapter of bound 1. Returns the function that stops both."""
    from tenure.observability import metrics
    from tenure.observability.exposition import MetricsServer

    offload = store.offload
    unwatch = metrics.watch_adapter(offload, "worker", worker.id) if offload is not None else None
    # Multiprocess mode (`tenure up`): the scrape happens elsewhere, so copy watched numbers every second.
    stop_refresher = metrics.start_refresher() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None
    server: MetricsServer | None = None
    if port is not None:
        server = MetricsServer(host, port)
        bound = await asyncio.to_thread(server.start)
        log.info("metrics on http://%s:%d/metrics", host, bound, extra={"worker_id": worker.id})

    async def stop() -> None:
        if stop_refresher is not None:
            stop_refresher()
        if unwatch is not None:
            unwatch()
        if server is not None:
            await asyncio.to_thread(server.stop)

    return stop


async def _with_client(args: argparse.Namespace, fn: Callable[[LocalClient], Awaitable[int]]) -> int:
    async with connect(settings=_settings(args)) as client:
        return await fn(client)


async def cmd_submit(args: argparse.Namespace) -> int:
    payload = _read_input(args.input)
    url = _gateway_url(args)
    if url is not None:
        return await _submit_via_gateway(args, url, payload)
    if args.follow:
        raise ConfigError("--follow streams from a gateway: give --url or TENURE_URL (or use --wait)")

    async def go(client: LocalClient) -> int:
        # The one admission door: a local submit is held to the caps and circuits (TENURE_MAX_QUEUED, ...) too.
        admitted = await client.submit(
            args.agent,
            payload,
            idempotency_key=args.idempotency_key,
            priority=args.priority,
            requires=args.requires.split(",") if args.requires else (),
            deadline_s=args.deadline_s,
            max_attempts=args.max_attempts,
        )
        job_id = admitted.job.id
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
                print(
                    f"{j.id:36}  {j.agent:18.18}  {j.state.value:9}  {j.epoch:>5}  "
                    f"{j.attempts:>2}/{j.max_attempts:<2}  {_ts(j.created_at):12}  {err}"
                )

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
                print(
                    f"execution  {e.id}  epoch {e.epoch}  {e.outcome:9}  worker {e.worker_id}  "
                    f"{_ts(e.started_at)} → {_ts(e.ended_at)}"
                )

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
                print(
                    f"{w.id:40}  {w.host:16.16}  {w.pid:>7}  {w.state.value:9}  {w.concurrency:>5}  "
                    f"{_ts(w.last_heartbeat):12}  {len(w.jobs_held)}"
                )

        _out(args, [w.to_dict() for w in workers], human)
        return 0

    return await _with_client(args, go)


async def cmd_doctor(args: argparse.Namespace) -> int:
    from tenure.doctor import diagnose

    report = await diagnose(_settings(args), max_skew_s=args.max_skew_s)

    def human() -> None:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for c in report.checks:
            print(f"{marks[c.status]}  {c.name:11} {c.detail}")
            for job in c.data.get("jobs", [])[:20]:
                print(
                    f"              job {job['job_id']} {job['state']} owner {job['owner']} "
                    f"{job['past_ttl_s']} s past its TTL"
                )
        print("healthy" if report.ok else "something is wrong (see FAIL above)")

    _out(args, report.to_dict(), human)
    return 0 if report.ok else 1


# -- through the gateway ------------------------------------------------------------------------------------------------
def _gateway_url(args: argparse.Namespace) -> str | None:
    return getattr(args, "url", None) or Settings.from_env().url


def _client(url: str) -> Client:
    from tenure.client import Client

    return Client(url)


def _print_event(e: Event) -> None:
    print(f"{e.cursor:>8}  {_ts(e.ts)}  {e.type:20}  {json.dumps(e.payload)}", flush=True)


async def _follow(client: Client, job_id: str, after: str | None, as_json: bool) -> str | None:
    last_type = None
    async for e in client.stream(job_id, after):
        last_type = e.type
        if as_json:
            print(json.dumps(e.to_dict()), flush=True)
        else:
            _print_event(e)
    return last_type


async def _submit_via_gateway(args: argparse.Namespace, url: str, payload: Any) -> int:
    async with _client(url) as client:
        admitted = await client.submit(
            args.agent,
            payload,
            idempotency_key=args.idempotency_key,
            priority=args.priority,
            requires=args.requires.split(",") if args.requires else None,
            deadline_s=args.deadline_s,
            max_attempts=args.max_attempts,
        )
        job_id = admitted.job.id
        if args.follow:
            if not args.json:
                print(f"job {job_id} ({'new' if admitted.created else 'existing, same idempotency key'})", flush=True)
            last = await _follow(client, job_id, None, args.json)
            return 0 if last == "job.succeeded" else 1
        if args.wait:
            job = await client.wait(job_id, args.timeout)
            _out(args, job.to_dict(), lambda: print(json.dumps(job.to_dict(), indent=2)))
            return 0 if job.state is JobState.SUCCEEDED else 1
        _out(args, {"id": job_id}, lambda: print(job_id))
        return 0


async def cmd_tail(args: argparse.Namespace) -> int:
    url = _gateway_url(args)
    if url is not None:
        async with _client(url) as client:
            last = await _follow(client, args.id, args.after, args.json)
            return 0 if last == "job.succeeded" else 1

    async def go(client: LocalClient) -> int:  # no gateway: poll the history in the store
        after, last = args.after, None
        while True:
            events = await client.events(args.id, after, 1000)
            for e in events:
                if args.json:
                    print(json.dumps(e.to_dict()), flush=True)
                else:
                    _print_event(e)
                after, last = e.cursor, e.type
            if not events:
                job = await client.job(args.id)
                if job.state.terminal and last is not None and last.startswith("job."):
                    return 0 if job.state is JobState.SUCCEEDED else 1
                await asyncio.sleep(0.2)

    return await _with_client(args, go)


async def cmd_cancel(args: argparse.Namespace) -> int:
    url = _gateway_url(args)
    outcome: str
    if url is not None:
        from tenure.client import GatewayError

        async with _client(url) as client:
            try:
                outcome = await client.cancel(args.id, wait=args.wait)
            except GatewayError as exc:
                if exc.status != 404:
                    raise
                outcome = "unknown"
    else:
        async with connect(settings=_settings(args)) as local:
            try:
                outcome = await local.cancel(args.id, wait=args.wait)
            except NotFound:
                outcome = "unknown"
    _out(args, {"id": args.id, "outcome": outcome}, lambda: print(outcome))
    return 1 if outcome == "unknown" else 0


async def cmd_approve(args: argparse.Namespace) -> int:
    approved = not args.reject
    url = _gateway_url(args)
    outcome: str
    if url is not None:
        async with _client(url) as client:
            outcome = await client.approve(args.id, approved, args.comment)
    else:
        async with connect(settings=_settings(args)) as local:
            try:
                outcome = await local.approve(args.id, approved, args.comment)
            except NotFound:
                outcome = "unknown"
    _out(args, {"id": args.id, "outcome": outcome}, lambda: print(outcome))
    return 0 if outcome in ("requested", "accepted") else 1


async def cmd_gateway(args: argparse.Namespace) -> int:
    from tenure.app import serve_gateway

    settings = _settings(args)
    await serve_gateway(settings, args.host, args.port, inline=args.inline)
    return 0


async def cmd_up(args: argparse.Namespace) -> int:
    import os

    from tenure.supervise import supervise

    settings = _settings(args)
    load_app(settings.app)  # fail here, once, rather than in every child
    await (await open_backends(settings)).close()  # migrate once before the children start
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every child writes its metrics here; the gateway's /metrics sums them (docs/observability.md).
        import tempfile

        from tenure.observability.multiprocess import prepare_multiprocess_dir

        directory = os.path.join(tempfile.gettempdir(), f"tenure-up-metrics-{os.getpid()}")
        await asyncio.to_thread(prepare_multiprocess_dir, directory)
    env = dict(os.environ)
    env["TENURE_DATABASE_URL"] = settings.database_url
    env["TENURE_APP"] = settings.app
    return await supervise(
        host=args.host,
        port=args.port,
        workers=args.workers,
        inline=args.inline,
        env=env,
        drain_timeout_s=settings.drain_timeout_s,
    )


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
            sp.add_argument("--app", help="the app as module:attribute (TENURE_APP; default tenure.demos.examples:app)")
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
    sp.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on this port (0: any free one; "
        "TENURE_METRICS_PORT); served from a thread, never the event loop",
    )
    sp.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
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
    sp.add_argument("--url", help="submit through this gateway (TENURE_URL) instead of the store directly")
    sp.add_argument("--follow", action="store_true", help="print the job's live event stream (needs a gateway)")
    sp.set_defaults(fn=cmd_submit)

    sp = sub.add_parser("tail", help="print a job's events until it finishes (live over SSE with --url)")
    common(sp)
    sp.add_argument("id")
    sp.add_argument("--after", help="start after this cursor (EPOCH-SEQ)")
    sp.add_argument("--url", help="the gateway (TENURE_URL); without one the store's history is polled")
    sp.set_defaults(fn=cmd_tail)

    sp = sub.add_parser("cancel", help="cancel a job: requested, accepted, already_finished or unknown")
    common(sp)
    sp.add_argument("id")
    sp.add_argument("--wait", type=float, help="with a gateway: wait up to this many seconds for the owner")
    sp.add_argument("--url", help="the gateway (TENURE_URL); without one the store is used directly")
    sp.set_defaults(fn=cmd_cancel)

    sp = sub.add_parser("approve", help="approve (or --reject) a job waiting in ctx.approval()")
    common(sp)
    sp.add_argument("id")
    sp.add_argument("--reject", action="store_true", help="answer no")
    sp.add_argument("--comment", help="a comment handed to the handler")
    sp.add_argument("--url", help="the gateway (TENURE_URL); without one the store is used directly")
    sp.set_defaults(fn=cmd_approve)

    sp = sub.add_parser("gateway", help="run the HTTP / WebSocket / SSE gateway")
    common(sp, json_flag=False)
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need API keys)")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--inline", action="store_true", help="run a worker inside the gateway (local fast path)")
    sp.set_defaults(fn=cmd_gateway)

    sp = sub.add_parser("up", help="run one gateway and N workers, supervised (Ctrl-C stops everything)")
    common(sp, json_flag=False)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    sp.add_argument("--inline", action="store_true", help="also run a worker inside the gateway process")
    sp.set_defaults(fn=cmd_up)

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
    sp.add_argument("--ui", action="store_true", help="end by leaving `tenure up` running and printing its dashboard URL")
    sp.set_defaults(fn=None, sync=lambda a: _demo(a))

    sp = sub.add_parser("mock-model", help="serve the bundled OpenAI-compatible mock model (for tests and demos)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8001)
    sp.add_argument("--max-concurrency", type=int, default=8, help="more requests in flight than this get 429")
    sp.add_argument("--latency-ms", type=float, default=50.0, help="time to the first token")
    sp.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    sp.set_defaults(fn=None, sync=lambda a: _mock_model(a))

    sp = sub.add_parser("doctor", help="check the store, Redis, clocks, schema, workers and stuck jobs")
    common(sp, app=False)
    sp.add_argument("--max-skew-s", type=float, default=1.0, help="clock skew that counts as a failure")
    sp.set_defaults(fn=cmd_doctor)

    sp = sub.add_parser("workers", help="list registered workers")
    common(sp)
    sp.add_argument("--all", action="store_true", help="include workers that are gone")
    sp.set_defaults(fn=cmd_workers)
    return p


def _demo(args: argparse.Namespace) -> int:
    from tenure.demos.demo import main as demo_main

    return demo_main([*(["--keep"] if args.keep else []), *(["--ui"] if args.ui else [])])


def _mock_model(args: argparse.Namespace) -> int:
    from tenure.demos.mock_model import serve

    serve(args.host, args.port, args.max_concurrency, args.latency_ms, args.tokens)
    return 0


def _explain(exc: BaseException) -> str:
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur) or type(cur).__name__
        if parts and text in parts[-1]:
            pass
        else:
            parts.append(text)
        # `raise ... from None` means the context is not a cause (a decoder's own error behind its rewording).
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return "; caused by: ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        env_settings = Settings.from_env()
        _setup_logging(args.log_level or env_settings.log_level, env_settings.log_format)
        if args.fn is None:
            return int(args.sync(args))
        return int(asyncio.run(args.fn(args)))
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
