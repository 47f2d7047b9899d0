"""What every dashboard page shares: the config, the session check, the rendering, the error page."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.insights import Insights
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.states import REQUEUEABLE, TERMINAL, JobState
from tenure.contracts.store import Leases
from tenure.gateway.auth import Principal
from tenure.gateway.ui.labs import LabRunner
from tenure.gateway.ui.sessions import Sessions
from tenure.gateway.ui.timeline import number
from tenure.gateway.ui.views import _fmt_age, _fmt_count, _pretty, _ts

if TYPE_CHECKING:
    from tenure.gateway.app import Gateway


log = logging.getLogger("tenure.gateway.ui")


class PageError(Exception):
    """A request the page refuses (a bad filter): answered with the page's own 4xx, never a 500."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class DashboardConfig:
    """What the composition root gives the dashboard besides the gateway: quotas and their lease backend, where
    the loop lag of workers can be read (the `/metrics` files of `tenure up`), and the lab runner."""

    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)
    leases: Leases | None = None
    loop_lags: Callable[[], Awaitable[Mapping[str, float]]] | None = None
    labs: LabRunner | None = None


class PagesBase:
    """The machinery of the dashboard's pages (see routes.py for the pages themselves)."""

    def __init__(self, gateway: Gateway, insights: Insights, sessions: Sessions, config: DashboardConfig) -> None:
        self.gw = gateway
        self.insights = insights
        self.sessions = sessions
        self.config = config
        self.env = Environment(
            loader=PackageLoader("tenure.gateway.ui", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,  # no stat() of a template file on the event loop per render
        )
        self.env.filters.update(age=_fmt_age, count=_fmt_count, ts=_ts, pretty=_pretty, num=number)
        self.env.globals.update(terminal=TERMINAL, requeueable=REQUEUEABLE, states=[s.value for s in JobState])

    def preload(self) -> None:
        """Compile every template (file reads: call it off the event loop, before serving)."""
        for name in self.env.list_templates(extensions=["html"]):
            self.env.get_template(name)

    # -- who is asking -----------------------------------------------------------------------------------------------
    def _who(self, request: Request) -> Principal | None:
        header = request.headers.get("authorization")
        if header is not None:
            return self.gw.auth.authenticate(header)
        session = self.sessions.read(request)
        return None if session is None else session.principal

    def _render(self, request: Request, template: str, who: Principal, status: int = 200, **ctx: Any) -> HTMLResponse:
        session = self.sessions.read(request)
        html = self.env.get_template(template).render(
            who=who,
            label="admin" if who.is_admin else f"tenant {who.tenant}",
            csrf=session.csrf if session is not None else "",
            open=self.sessions.open,
            path=request.url.path,
            labs_enabled=self.config.labs is not None and self._may_run_labs(who),
            **ctx,
        )
        return HTMLResponse(html, status, headers={"Cache-Control": "no-store"})

    async def _page(self, request: Request, build: Callable[[Principal], Awaitable[Response]]) -> Response:
        """Authenticate a page (to the login form when signed out) and answer its errors as pages, never 5xx."""
        who = self._who(request)
        if who is None:
            if request.headers.get("authorization") is not None or request.url.path.startswith("/ui/api"):
                return JSONResponse({"detail": "sign in first"}, 401)
            target = "/ui/login?" + urlencode(
                {"next": request.url.path + ("?" + request.url.query if request.url.query else "")}
            )
            return RedirectResponse(target, 303)
        started = time.perf_counter()
        try:
            response = await build(who)
            # The time spent answering at the server (bench/ui.py reads it; so can a browser's devtools).
            response.headers["Server-Timing"] = f"page;dur={(time.perf_counter() - started) * 1000:.1f}"
            return response
        except PageError as exc:
            return self._render(request, "error.html", who, exc.status, message=exc.message)
        except StoreUnavailable as exc:
            log.warning("dashboard: the store did not answer: %s", exc)
            return self._render(request, "error.html", who, 503, message="The store did not answer; retry shortly.")

    def _may_run_labs(self, who: Principal) -> bool:
        return who.is_admin or self.sessions.open

    def _check_change(self, request: Request) -> Principal:
        """A change made from a dashboard page: a key, or the session with its CSRF token, from this origin."""
        header = request.headers.get("authorization")
        who = self.gw.auth.authenticate(header) if header is not None else self.sessions.principal(request, "POST")
        if who is None:
            raise PageError(403, "sign in again: this change needs the page's session token")
        return who
