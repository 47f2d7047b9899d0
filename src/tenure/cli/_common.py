"""What every `tenure` command shares: its settings, its output, how it reads an input, its gateway client."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tenure.contracts.errors import InvalidRequest
from tenure.contracts.types import Event, Job
from tenure.control.json_input import parse_json
from tenure.local import LocalClient, connect
from tenure.observability.logs import setup_logging
from tenure.settings import Settings

if TYPE_CHECKING:
    from tenure.client import Client


def settings_of(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings.from_env(database_url=getattr(args, "database_url", None), app=getattr(args, "app", None), **extra)


def setup_cli_logging(level: str, fmt: str = "auto") -> None:
    # Structured logs (docs/observability.md): JSON lines, or a readable line on a terminal.
    setup_logging(level, fmt, sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise for the CLI


def out(args: argparse.Namespace, data: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        human()


def ts(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def print_job(job: Job) -> None:
    print(f"job        {job.id}")
    print(f"agent      {job.agent}  (tenant {job.tenant}, priority {job.priority})")
    print(f"state      {job.state.value}  epoch {job.epoch}  attempts {job.attempts}/{job.max_attempts}")
    print(f"owner      {job.owner or '-'}  execution {job.execution_id or '-'}")
    print(f"created    {ts(job.created_at)}  started {ts(job.execution_started_at)}  finished {ts(job.finished_at)}")
    if job.concurrency_key is not None:
        print(f"key        {job.concurrency_key}" + ("  (waiting for its turn)" if job.key_wait else ""))
    if job.degraded_reason is not None:
        print(f"degraded   {job.mode_requested} → {job.mode_effective} ({job.degraded_reason})")
    if job.parent_job_id is not None:
        print(f"parent     {job.parent_job_id}  execution {job.parent_execution_id or '-'}")
    for child in job.children or ():
        print(f"child      {child.id}  {child.agent}  {child.state.value}")
    if job.error_code:
        print(f"error      {job.error_code}: {job.error_message}")
    if job.result is not None:
        print(f"result     {json.dumps(job.result)}")


def read_input(text: str) -> Any:
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


def gateway_url(args: argparse.Namespace) -> str | None:
    return getattr(args, "url", None) or Settings.from_env().url


def gateway_client(url: str) -> Client:
    from tenure.client import Client

    return Client(url)


def print_event(e: Event) -> None:
    print(f"{e.cursor:>8}  {ts(e.ts)}  {e.type:20}  {json.dumps(e.payload)}", flush=True)


async def follow(client: Client, job_id: str, after: str | None, as_json: bool) -> str | None:
    last_type = None
    async for e in client.stream(job_id, after):
        last_type = e.type
        if as_json:
            print(json.dumps(e.to_dict()), flush=True)
        else:
            print_event(e)
    return last_type


async def with_client(args: argparse.Namespace, fn: Callable[[LocalClient], Awaitable[int]]) -> int:
    async with connect(settings=settings_of(args)) as client:
        return await fn(client)
