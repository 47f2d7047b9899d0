"""The `tenure` command line. Every read command accepts `--json`; errors print their chain of causes in one
paragraph and exit non-zero (2 for bad usage or configuration, 1 for everything else).

    _common.py   settings, output, input, the gateway client
    run.py       migrate, worker, gateway, up, doctor, demo, mock-model
    jobs.py      submit, tail, cancel, approve, jobs, job, events, requeue, workers, drain
    audit.py     audit, usage
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tenure.cli._common import setup_cli_logging
from tenure.cli.audit import cmd_audit, cmd_usage
from tenure.cli.jobs import (
    cmd_approve,
    cmd_cancel,
    cmd_drain,
    cmd_events,
    cmd_job,
    cmd_jobs,
    cmd_requeue,
    cmd_route,
    cmd_submit,
    cmd_tail,
    cmd_workers,
)
from tenure.cli.run import cmd_doctor, cmd_gateway, cmd_migrate, cmd_up, cmd_worker, run_demo, run_mock_model
from tenure.contracts.errors import ConfigError, TenureError
from tenure.contracts.states import JobState
from tenure.settings import DEFAULT_APP, Settings


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
            sp.add_argument("--app", help=f"the app as module:attribute (TENURE_APP; default {DEFAULT_APP})")
        if json_flag:
            sp.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sp = sub.add_parser("migrate", help="apply pending schema migrations")
    common(sp, app=False)
    sp.set_defaults(fn=cmd_migrate)

    sp = sub.add_parser("worker", help="run a worker process (SIGTERM drains it)")
    common(sp, json_flag=False)
    sp.add_argument("--concurrency", type=int, help="job slots in this process (TENURE_CONCURRENCY; default 10)")
    sp.add_argument(
        "--capabilities",
        help="comma-separated capabilities this worker offers: category/subcategory (text/summarize), "
        "category/* for a whole category, or flat tags (TENURE_CAPABILITIES)",
    )
    sp.add_argument("--features", help="comma-separated features this worker offers, e.g. gpu,long (TENURE_FEATURES)")
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
    sp.add_argument("--prefers", help="comma-separated features a worker is preferred for (docs/routing.md)")
    sp.add_argument("--strict", action="store_true", help="with --prefers: only a worker offering them all claims it")
    sp.add_argument("--deadline-s", type=float, help="queue deadline: expire if not started within (default 300)")
    sp.add_argument("--max-attempts", type=int, help="executions before the job is dead (default: the agent's)")
    sp.add_argument("--concurrency-key", help="at most the agent's key_limit jobs of this key run at once")
    sp.add_argument(
        "--multitask",
        choices=["enqueue", "reject", "interrupt", "drop_queued"],
        help="when the key is busy: wait, refuse, cancel the running job, or replace queued ones (default: the agent's)",
    )
    sp.add_argument("--mode", help="the mode to run in, of those the agent declares (e.g. deep, fast)")
    sp.add_argument("--budget", help='limits as JSON, e.g. \'{"tool_calls": 50, "cost": 2.5}\' (docs/budgets.md)')
    sp.add_argument("--wait", action="store_true", help="wait for the job to finish and print it")
    sp.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")
    sp.add_argument("--url", help="submit through this gateway (TENURE_URL) instead of the store directly")
    sp.add_argument("--follow", action="store_true", help="print the job's live event stream (needs a gateway)")
    sp.add_argument(
        "--allow-unregistered",
        action="store_true",
        help="accept an agent that neither the app nor any live worker knows yet (TENURE_ALLOW_UNREGISTERED)",
    )
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
    sp.add_argument(
        "--inline",
        action="store_true",
        help="run a worker inside the gateway: the jobs it admits start there while it has room (local fast path)",
    )
    sp.set_defaults(fn=cmd_gateway)

    sp = sub.add_parser("up", help="run one gateway and N workers, supervised (Ctrl-C stops everything)")
    common(sp, json_flag=False)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    sp.add_argument(
        "--inline",
        action="store_true",
        help="also run a worker inside the gateway: jobs it admits start there while it has room",
    )
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

    sp = sub.add_parser("audit", help="show a job's audit: executions, tool calls, evidence, usage, journal steps")
    common(sp)
    sp.add_argument("id")
    sp.set_defaults(fn=cmd_audit)

    sp = sub.add_parser("usage", help="usage (ctx.usage) summed per tenant, agent or model")
    common(sp)
    sp.add_argument("--from", dest="from_s", type=float, help="from this time (epoch seconds; default: all time)")
    sp.add_argument("--to", dest="to_s", type=float, help="until this time (epoch seconds, excluded)")
    sp.add_argument("--group-by", choices=["tenant", "agent", "model"], default="tenant")
    sp.set_defaults(fn=cmd_usage)

    sp = sub.add_parser("requeue", help="put a dead (or failed, lost, expired, cancelled) job back in the queue")
    common(sp)
    sp.add_argument("id")
    sp.add_argument("--input", help="run it with this input instead: JSON text, @file or - (recorded in its audit)")
    sp.set_defaults(fn=cmd_requeue)

    sp = sub.add_parser("demo", help="run the demo on a temporary SQLite file (what `make demo` runs)")
    sp.add_argument("--keep", action="store_true", help="keep the temporary directory afterwards")
    sp.add_argument("--ui", action="store_true", help="end by leaving `tenure up` running and printing its dashboard URL")
    sp.set_defaults(fn=None, sync=run_demo)

    sp = sub.add_parser("mock-model", help="serve the bundled OpenAI-compatible mock model (for tests and demos)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8001)
    sp.add_argument("--max-concurrency", type=int, default=8, help="more requests in flight than this get 429")
    sp.add_argument("--latency-ms", type=float, default=50.0, help="time to the first token")
    sp.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    sp.set_defaults(fn=None, sync=run_mock_model)

    sp = sub.add_parser("doctor", help="check the store, Redis, clocks, schema, workers and stuck jobs")
    common(sp, app=False)
    sp.add_argument("--max-skew-s", type=float, default=1.0, help="clock skew that counts as a failure")
    sp.set_defaults(fn=cmd_doctor)

    sp = sub.add_parser("workers", help="list registered workers")
    common(sp)
    sp.add_argument("--all", action="store_true", help="include workers that are gone")
    sp.set_defaults(fn=cmd_workers)

    sp = sub.add_parser("route", help="how a job of AGENT would be routed now: every candidate's score by factor")
    common(sp)
    sp.add_argument("agent", metavar="AGENT", help="the agent")
    sp.add_argument("--requires", help="comma-separated capability tags the job requires")
    sp.add_argument("--prefers", help="comma-separated features the job prefers")
    sp.add_argument("--strict", action="store_true", help="the preferred features are required")
    sp.set_defaults(fn=cmd_route)

    sp = sub.add_parser("drain", help="ask a worker to drain: finish what it holds, claim nothing new, exit 0")
    common(sp)
    sp.add_argument("worker_id", metavar="WORKER_ID", help="the worker's id (`tenure workers`)")
    sp.add_argument("--timeout", type=float, help="seconds to finish running jobs (default: its TENURE_DRAIN_TIMEOUT_S)")
    sp.set_defaults(fn=cmd_drain)
    return p


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
        setup_cli_logging(args.log_level or env_settings.log_level, env_settings.log_format)
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
