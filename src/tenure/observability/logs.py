"""Structured logs: one JSON object per line (or a readable line on a terminal), with the job's identity.

Seed 002 (section 7): job id, worker id, state, time, duration and error code answer most questions, if
they are fields and not prose. Every record may carry the fields of `FIELDS`, given with
`extra={...}` or inherited from `job_context()`: the worker sets it around each execution, so every line
a handler logs (`ctx.log`, or any logger) names its job, even from a thread of the blocking adapter
(context variables follow `ctx.to_thread`).

    setup_logging(level="info", fmt="auto")    # auto: console on a TTY, else JSON
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

__all__ = [
    "FIELDS",
    "ConsoleFormatter",
    "JsonFormatter",
    "bind_log_context",
    "job_context",
    "set_process_log_fields",
    "setup_logging",
]

FIELDS = ("job_id", "execution_id", "worker_id", "agent", "state", "epoch", "duration_ms", "error_code")
# Other `extra` keys the runtime sets (loop stalls, heartbeats); any other extra key is carried too.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("tenure_log_context", default=None)


@contextlib.contextmanager
def job_context(**fields: Any) -> Iterator[None]:
    """Within the block (and tasks or threads started from it), every log record carries `fields`."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


_process_fields: dict[str, Any] = {}


def set_process_log_fields(**fields: Any) -> None:
    """Fields every record of this process carries (`role`, `worker_id`), threads included: the lag
    watchdog and the adapters' threads do not inherit the loop's context variables."""
    _process_fields.update({k: v for k, v in fields.items() if v is not None})


def bind_log_context(**fields: Any) -> None:
    """Like `job_context`, without an end: for a task that handles one job, whose context dies with it."""
    _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {**_process_fields, **(_context.get() or {})}
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the known fields, any other extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """`12:00:01.234 INFO  tenure.worker  job finished  job_id=… state=succeeded duration_ms=12`."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        fields = _fields(record)
        ordered = [k for k in FIELDS if k in fields] + sorted(k for k in fields if k not in FIELDS)
        tail = "  " + " ".join(f"{k}={fields[k]}" for k in ordered) if ordered else ""
        line = f"{ts} {record.levelname:<7} {record.name}  {record.getMessage()}{tail}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "info", fmt: str = "auto", stream: IO[str] | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one that writes `fmt` (auto | json | console) to `stream`
    (stderr by default); `auto` means console when the stream is a terminal, JSON otherwise."""
    stream = stream or sys.stderr
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        fmt = "console" if isatty is not None and isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    return handler
