"""Serving `/metrics` without the event loop: a thread server for workers, an ASGI app for the gateway.

Rendering the exposition text is synchronous (and in multiprocess mode it reads one file per process), so
neither endpoint renders on an event loop: the worker's server is a plain thread (it keeps answering, and
`event_loop_lag_max_seconds` keeps growing, while the loop is frozen), and the gateway's ASGI app hands the
rendering to one dedicated thread (a bound of 1: scrapes take turns, the loop only awaits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socketserver
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from tenure.observability import metrics

__all__ = ["MetricsServer", "metrics_asgi_app", "registry_for_scrape", "render"]


def registry_for_scrape() -> CollectorRegistry:
    """The registry a scrape should read: the process's own, or, in multiprocess mode (`tenure up`), one
    that aggregates the files of every process under `PROMETHEUS_MULTIPROC_DIR`."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from tenure.observability.multiprocess import aggregate_registry

        return aggregate_registry()
    return REGISTRY


def render(registry: CollectorRegistry | None = None) -> bytes:
    """Refresh the watched objects and render the exposition text (blocking: call it off the loop)."""
    metrics.refresh()
    return generate_latest(registry or registry_for_scrape())


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: no access log
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class MetricsServer:
    """`GET /metrics` on a daemon thread. `start()` binds (port 0 picks a free one) and returns the port."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry | None = None) -> None:
        self._host = host
        self._port = port
        self._registry = registry
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; try /metrics\n"]
        body = render(self._registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

    def start(self) -> int:
        """Bind and serve on a daemon thread; return the bound port. Blocking (a bind): not on the loop."""
        server = make_server(self._host, self._port, self._app, _ThreadingServer, _QuietHandler)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="tenure-metrics-http", daemon=True)
        self._thread.start()
        return int(server.server_port)

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving (blocking until the serve loop exits: call it off the loop)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def metrics_asgi_app(
    registry: CollectorRegistry | None = None,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app answering `GET` with the exposition text; mount it at `/metrics` in the gateway
    (Starlette: `Mount("/metrics", app=metrics_asgi_app())`). Rendering runs on one dedicated thread."""
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tenure-metrics-render")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await asyncio.get_running_loop().run_in_executor(executor, render, registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app
