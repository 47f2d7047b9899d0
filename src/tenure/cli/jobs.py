"""The `tenure` commands about jobs: submit, tail, cancel, approve (through a gateway or the store), jobs, job,
events, requeue, workers."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from tenure.cli._common import (
    follow,
    gateway_client,
    gateway_url,
    out,
    print_event,
    print_job,
    read_input,
    settings_of,
    ts,
    with_client,
)
from tenure.contracts.errors import ConfigError, NotFound
from tenure.contracts.states import JobState
from tenure.contracts.types import Job
from tenure.local import LocalClient, connect


def read_budget(text: str | None) -> Any:
    """`--budget JSON`: the job's limits (admission validates them)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(f"--budget is not JSON: {text!r} (e.g. '{{\"tool_calls\": 50}}')") from None


async def cmd_submit(args: argparse.Namespace) -> int:
    payload = read_input(args.input)
    url = gateway_url(args)
    if url is not None:
        if args.allow_unregistered:
            raise ConfigError("--allow-unregistered applies to a submit to the store: a gateway decides by its own "
                              "TENURE_ALLOW_UNREGISTERED")  # fmt: skip
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
            concurrency_key=args.concurrency_key,
            multitask=args.multitask,
            mode=args.mode,
            budget=read_budget(args.budget),
            allow_unregistered=args.allow_unregistered,
            prefers=args.prefers.split(",") if args.prefers else (),
            strict=args.strict,
        )
        job_id = admitted.job.id
        if not args.wait:
            out(args, {"id": job_id}, lambda: print(job_id))
            return 0
        job = await _wait(client, job_id, args.timeout)
        out(args, job.to_dict(), lambda: print_job(job))
        return 0 if job.state is JobState.SUCCEEDED else 1

    return await with_client(args, go)


async def _wait(client: Any, job_id: str, timeout_s: float | None) -> Job:
    """`--wait`: the job once terminal; at `--timeout`, the job as it stands (its state says it is not done, so the
    exit code is 1) and a line on stderr saying so. The job itself goes on: a wait never cancels it."""
    try:
        return await client.wait(job_id, timeout_s)  # type: ignore[no-any-return]
    except TimeoutError:
        job = await client.job(job_id)
        print(
            f"tenure: job {job_id} is still {job.state.value} after {timeout_s:g} s; it goes on (`tenure job {job_id}`)",
            file=sys.stderr,
        )
        return job  # type: ignore[no-any-return]


async def _submit_via_gateway(args: argparse.Namespace, url: str, payload: Any) -> int:
    async with gateway_client(url) as client:
        admitted = await client.submit(
            args.agent,
            payload,
            idempotency_key=args.idempotency_key,
            priority=args.priority,
            requires=args.requires.split(",") if args.requires else None,
            deadline_s=args.deadline_s,
            max_attempts=args.max_attempts,
            concurrency_key=args.concurrency_key,
            multitask=args.multitask,
            mode=args.mode,
            budget=read_budget(args.budget),
            prefers=args.prefers.split(",") if args.prefers else None,
            strict=args.strict,
        )
        job_id = admitted.job.id
        if args.follow:
            if not args.json:
                print(f"job {job_id} ({'new' if admitted.created else 'existing, same idempotency key'})", flush=True)
            last = await follow(client, job_id, None, args.json)
            return 0 if last == "job.succeeded" else 1
        if args.wait:
            job = await _wait(client, job_id, args.timeout)
            out(args, job.to_dict(), lambda: print(json.dumps(job.to_dict(), indent=2)))
            return 0 if job.state is JobState.SUCCEEDED else 1
        out(args, {"id": job_id}, lambda: print(job_id))
        return 0


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
                    f"{j.attempts:>2}/{j.max_attempts:<2}  {ts(j.created_at):12}  {err}"
                )

        out(args, [j.to_dict() for j in jobs], human)
        return 0

    return await with_client(args, go)


async def cmd_job(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        job = await client.service.job_detail(args.id)
        executions = await client.store.list_executions(job.id)
        waiting = await client.service.waiting_reason(job)
        route = await client.service.route(job)
        data = job.to_dict() | {
            "waiting_reason": waiting,
            "route": route,
            "executions": [e.__dict__ if hasattr(e, "__dict__") else _slots(e) for e in executions],
        }

        def human() -> None:
            print_job(job)
            if waiting is not None:
                print(f"waiting    {waiting['kind']}: {waiting['detail']}")
            if route is not None:
                print(f"route      {route['why']}")
            for e in executions:
                print(
                    f"execution  {e.id}  epoch {e.epoch}  {e.outcome:9}  worker {e.worker_id}  "
                    f"{ts(e.started_at)} → {ts(e.ended_at)}"
                )

        out(args, data, human)
        return 0

    return await with_client(args, go)


def _slots(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


async def cmd_events(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        events = await client.events(args.id, args.after, args.limit)

        def human() -> None:
            for e in events:
                print(f"{e.cursor:>8}  {ts(e.ts)}  {e.type:20}  {json.dumps(e.payload)}")

        out(args, [e.to_dict() for e in events], human)
        return 0

    return await with_client(args, go)


async def cmd_requeue(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        job = await client.requeue(args.id, input=read_input(args.input)) if args.input else await client.requeue(args.id)
        out(args, job.to_dict(), lambda: print(f"requeued {job.id} ({job.agent}); it is {job.state.value}"))
        return 0

    return await with_client(args, go)


async def cmd_workers(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        workers = await client.workers(include_gone=args.all)

        def human() -> None:
            print(
                f"{'ID':40}  {'HOST':16}  {'PID':>7}  {'STATE':9}  {'BUSY':>7}  {'OK':>5}  {'LATENCY':>9}  "
                f"{'HEARTBEAT':12}  JOBS HELD  CAPABILITIES / FEATURES"
            )
            for w in workers:
                ok = "-" if w.success_rate is None else f"{w.success_rate:.0%}"
                latency = "-" if w.latency_ms is None else f"{w.latency_ms:.0f} ms"
                offers = ",".join(w.capabilities) or "-"
                print(
                    f"{w.id:40}  {w.host:16.16}  {w.pid:>7}  {w.state.value:9}  {f'{w.in_flight}/{w.concurrency}':>7}  "
                    f"{ok:>5}  {latency:>9}  {ts(w.last_heartbeat):12}  {len(w.jobs_held):>9}  "
                    f"{offers} / {','.join(w.features) or '-'}"
                )

        out(args, [w.to_dict() for w in workers], human)
        return 0

    return await with_client(args, go)


async def cmd_route(args: argparse.Namespace) -> int:
    """`tenure route AGENT`: the routing table of a job not yet submitted, from the live registry."""

    async def go(client: LocalClient) -> int:
        route = await client.service.route_preview(
            args.agent,
            args.requires.split(",") if args.requires else (),
            args.prefers.split(",") if args.prefers else (),
            args.strict,
        )

        def human() -> None:
            w1, w2, w3 = route["weights"]
            print(f"agent {args.agent}: weights load {w1:g}, success {w2:g}, latency {w3:g}; latency limit "
                  f"{route['limit_ms']:g} ms; +{route['feature_bonus']:g} per preferred feature "
                  f"({','.join(route['prefers']) or 'none'}{', strict' if route['strict'] else ''})")  # fmt: skip
            print(f"{'WORKER':40}  {'SCORE':>7}  {'LOAD':>6}  {'SUCCESS':>7}  {'LATENCY':>9}  {'FREE':>4}  FEATURES")
            for c in route["candidates"]:
                latency = "-" if c["latency_ms"] is None else f"{c['latency_ms']:.0f} ms"
                success = f"{c['success_rate']:.3f}" + ("" if c["recorded_success_rate"] is not None else "*")
                print(
                    f"{c['worker_id']:40}  {c['score']:>7.4f}  {c['load']:>6.3f}  {success:>7}  {latency:>9}  "
                    f"{'yes' if c['free'] else 'no':>4}  {','.join(c['features']) or '-'}"
                )
            why = {
                "preferred": f"preferred: {route['preferred_worker']}",
                "only_candidate": "one candidate: no preference (nothing to choose)",
                "no_free_slot": "no candidate has a free slot: no preference",
                "no_candidate": "no live worker serves it with these requirements",
            }[route["reason"]]
            print(why + ("  (* no record yet: the prior)" if any(
                c["recorded_success_rate"] is None for c in route["candidates"]) else ""))  # fmt: skip

        out(args, route, human)
        return 0

    return await with_client(args, go)


async def cmd_tail(args: argparse.Namespace) -> int:
    url = gateway_url(args)
    if url is not None:
        async with gateway_client(url) as client:
            last = await follow(client, args.id, args.after, args.json)
            return 0 if last == "job.succeeded" else 1

    async def go(client: LocalClient) -> int:  # no gateway: poll the history in the store
        after, last = args.after, None
        while True:
            events = await client.events(args.id, after, 1000)
            for e in events:
                if args.json:
                    print(json.dumps(e.to_dict()), flush=True)
                else:
                    print_event(e)
                after, last = e.cursor, e.type
            if not events:
                job = await client.job(args.id)
                if job.state.terminal and last is not None and last.startswith("job."):
                    return 0 if job.state is JobState.SUCCEEDED else 1
                await asyncio.sleep(0.2)

    return await with_client(args, go)


async def cmd_cancel(args: argparse.Namespace) -> int:
    url = gateway_url(args)
    outcome: str
    if url is not None:
        from tenure.client import GatewayError

        async with gateway_client(url) as client:
            try:
                outcome = await client.cancel(args.id, wait=args.wait)
            except GatewayError as exc:
                if exc.status != 404:
                    raise
                outcome = "unknown"
    else:
        async with connect(settings=settings_of(args)) as local:
            try:
                outcome = await local.cancel(args.id, wait=args.wait)
            except NotFound:
                outcome = "unknown"
    out(args, {"id": args.id, "outcome": outcome}, lambda: print(outcome))
    return 1 if outcome == "unknown" else 0


async def cmd_approve(args: argparse.Namespace) -> int:
    approved = not args.reject
    url = gateway_url(args)
    outcome: str
    if url is not None:
        async with gateway_client(url) as client:
            outcome = await client.approve(args.id, approved, args.comment)
    else:
        async with connect(settings=settings_of(args)) as local:
            try:
                outcome = await local.approve(args.id, approved, args.comment)
            except NotFound:
                outcome = "unknown"
    out(args, {"id": args.id, "outcome": outcome}, lambda: print(outcome))
    return 0 if outcome in ("requested", "accepted") else 1


async def cmd_drain(args: argparse.Namespace) -> int:
    async def go(client: LocalClient) -> int:
        w = await client.drain(args.worker_id, args.timeout)
        within = "its TENURE_DRAIN_TIMEOUT_S" if args.timeout is None else f"{args.timeout:g} s"
        out(
            args,
            w.to_dict(),
            lambda: print(
                f"worker {w.id} draining: at its next heartbeat it stops claiming, finishes what it holds within "
                f"{within}, fails the rest with worker_shutdown, and exits 0"
            ),
        )
        return 0

    return await with_client(args, go)
