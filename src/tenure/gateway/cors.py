"""Browsers as clients: a CORS allow-list, and `?access_token=` for the streams a browser cannot send headers on.

`TENURE_CORS_ORIGINS='https://app.example.com,http://localhost:5173'` lists the exact origins (scheme, host and
port; no path, no wildcard) whose pages may call the API from another origin. A preflight (`OPTIONS` with
`Access-Control-Request-Method`) from a listed origin is answered 200 with the methods and headers the API
takes; from any other origin it is refused (400), and an actual response carries no `Access-Control-Allow-*`
header, so the browser withholds it from the page. Credentials (`Access-Control-Allow-Credentials: true`) are
allowed for listed origins only. With no origin listed (the default) there is no CORS at all: `OPTIONS` answers
405 as before and browsers keep every other origin out.

`EventSource` and `WebSocket` cannot set `Authorization`, so both streams take the key as `?access_token=KEY`.
`AccessToken` takes it out of the query string before any route or log sees the URL: it moves to
`scope["tenure.access_token"]`, so an access log (uvicorn's, when enabled) and every error detail show the path
without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from tenure.contracts.errors import ConfigError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

TOKEN_PARAM = "access_token"
SCOPE_KEY = "tenure.access_token"
ALLOW_METHODS = ("GET", "POST")
ALLOW_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")
EXPOSE_HEADERS = ("Location", "Retry-After")


def parse_origins(text: str | None) -> tuple[str, ...]:
    """The origins of `TENURE_CORS_ORIGINS` (comma-separated), each checked: `scheme://host[:port]` exactly."""
    out: list[str] = []
    for item in (text or "").split(","):
        origin = item.strip()
        if not origin:
            continue
        parts = urlsplit(origin)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path
            or parts.query
            or parts.fragment
            or parts.username
            or "*" in origin
        ):
            raise ConfigError(
                f"TENURE_CORS_ORIGINS: {origin!r} is not an origin (expected scheme://host[:port], e.g. "
                "https://app.example.com; no path, no wildcard)"
            )
        out.append(origin.rstrip("/").lower())
    return tuple(dict.fromkeys(out))


def cors_middleware(origins: tuple[str, ...]) -> list[Middleware]:
    """Starlette's CORS middleware for exactly these origins, or nothing when none is listed."""
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=list(ALLOW_METHODS),
            allow_headers=list(ALLOW_HEADERS),
            expose_headers=list(EXPOSE_HEADERS),
            allow_credentials=True,
            max_age=600,
        )
    ]


class AccessToken:
    """ASGI middleware: move `?access_token=` out of the query string into `scope["tenure.access_token"]`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            raw: bytes = scope.get("query_string", b"")
            if TOKEN_PARAM.encode() in raw:
                pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
                tokens = [v for k, v in pairs if k == TOKEN_PARAM]
                if tokens:
                    scope[SCOPE_KEY] = tokens[-1]
                    # Mutated in place: the server's access log formats this same scope when it logs.
                    scope["query_string"] = urlencode([(k, v) for k, v in pairs if k != TOKEN_PARAM]).encode("latin-1")
        await self.app(scope, receive, send)


def access_token(scope: Scope) -> str | None:
    """The `?access_token=` of this request, if it had one (taken out of its query string by `AccessToken`)."""
    token = scope.get(SCOPE_KEY)
    return token if isinstance(token, str) and token else None
