"""The dashboard's operations pages: workers, quotas, dead letters, the overview, the labs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tenure.contracts.errors import NotFound, TenureError
from tenure.contracts.insights import JobQuery
from tenure.contracts.states import JobState
from tenure.contracts.store import line_key, ticket_holder
from tenure.contracts.types import is_uuid
from tenure.gateway.auth import Principal

if TYPE_CHECKING:
    pass


from tenure.gateway.ui.base import PageError, PagesBase
from tenure.gateway.ui.views import HOUR_S, LATENCY_SAMPLE, PAGE, _quantile, _ticket_since, log, throughput_chart


class OpsPages(PagesBase):
    """The pages about the fleet rather than one job."""

    # -- workers, quotas, dead letters ------------------------------------------------------------------------------------
    async def workers(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            include_gone = request.query_params.get("all") == "1"
            workers, now = await asyncio.gather(self.gw.store.list_workers(include_gone), self.gw.store.server_time())
            lags: Mapping[str, float] = {}
            if self.config.loop_lags is not None:
                try:
                    lags = await self.config.loop_lags()
                except Exception as exc:  # the metrics files are a nicety: the registry is shown without them
                    log.debug("loop lag unavailable: %s", exc)
            return self._render(
                request,
                "workers.html",
                who,
                workers=workers,
                now=now,
                lags=lags,
                include_gone=include_gone,
                lag_known=self.config.loop_lags is not None,
                show_ids=who.is_admin,
                fragment=request.query_params.get("fragment") == "1",
            )

        return await self._page(request, build)

    async def drain_worker(self, request: Request) -> Response:
        """POST /ui/api/workers/{id}/drain: the workers page's Drain button (an admin's session), the same request
        as `POST /v1/workers/{id}/drain` and `tenure drain`, with the worker's own drain timeout."""
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if not who.is_admin:
            return JSONResponse({"detail": "draining a worker needs the admin key"}, 403)
        try:
            drained = await self.gw.jobs.drain_worker(request.path_params["worker_id"])
        except NotFound as exc:
            return JSONResponse({"detail": str(exc)}, 404)
        except TenureError as exc:
            return JSONResponse({"detail": str(exc)}, 503)
        return JSONResponse({"worker_id": drained.id, "state": drained.state.value}, 202)

    async def quotas(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            now = await self.gw.store.server_time()
            rows = await self._quota_rows(who) if self.config.leases is not None else []
            return self._render(
                request,
                "quotas.html",
                who,
                quotas=rows,
                now=now,
                has_backend=self.config.leases is not None,
                configured=bool(self.config.quotas),
                fragment=request.query_params.get("fragment") == "1",
            )

        return await self._page(request, build)

    async def _quota_rows(self, who: Principal) -> list[dict[str, Any]]:
        leases = self.config.leases
        assert leases is not None
        rows: list[dict[str, Any]] = []
        executions: set[str] = set()
        for key, spec in sorted(self.config.quotas.items()):
            holders = await leases.holders(key)
            line = sorted(await leases.holders(line_key(key)))
            rows.append({"spec": spec, "holders": holders, "line": line})
            executions.update(h.rpartition(":")[0] for h in holders)
            executions.update(ticket_holder(t).rpartition(":")[0] for t in line)
        found = await self.insights.jobs_by_execution(sorted(executions))
        by_execution = {j.execution_id: j for j in found if j.execution_id is not None}

        def who_holds(holder: str) -> dict[str, Any]:
            j = by_execution.get(holder.rpartition(":")[0])
            visible = j is not None and (who.is_admin or j.tenant == who.tenant)
            return {"holder": holder, "job": j if visible else None, "other": j is not None and not visible}

        for row in rows:
            spec = row["spec"]
            row["held"] = [who_holds(h) for h in row["holders"]]
            row["waiting"] = []
            for position, ticket in enumerate(row["line"], start=1):
                entry = who_holds(ticket_holder(ticket))
                entry.update(position=position, since=_ticket_since(ticket))
                full = len(row["holders"]) >= spec.limit
                entry["blocked_on"] = (
                    f"{spec.key}: all {spec.limit} slots held" if full else f"{spec.key}: a slot is being handed over"
                )
                if position > 1:
                    entry["blocked_on"] += f", {position - 1} ahead in line"
                row["waiting"].append(entry)
        return rows

    async def dead(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            before = request.query_params.get("before", "").strip()
            if before and not is_uuid(before):
                raise PageError(400, "The page cursor is the id of a job.")
            tenant = who.tenant
            page, now = await asyncio.gather(
                self.insights.job_page(JobQuery(tenant, JobState.DEAD, None, before or None, PAGE)),
                self.gw.store.server_time(),
            )
            return self._render(
                request,
                "dead.html",
                who,
                jobs=page.jobs,
                now=now,
                next_url=f"/ui/dead?before={page.next_before}" if page.next_before else None,
            )

        return await self._page(request, build)

    # -- overview -----------------------------------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            now = await self.gw.store.server_time()
            since = now - HOUR_S
            gate = self.gw.config.gate
            counts, buckets, sample, failures = await asyncio.gather(
                self.insights.count_by_state(who.tenant),
                self.insights.finished_since(who.tenant, since),
                self.insights.latency_sample(who.tenant, since, LATENCY_SAMPLE),
                self.insights.circuit_failures(now - gate.breaker_window_s),
            )
            circuits = []
            for row in failures:
                state = await self.gw.store.circuit_state(
                    row.key, gate.breaker_threshold, gate.breaker_window_s, gate.breaker_open_s
                )
                circuits.append(
                    {"key": row.key, "failures": state.failures, "open_for_s": state.open_for_s, "last": row.last_failure_at}
                )
            waits = [s.queue_wait_s for s in sample if s.queue_wait_s is not None]
            dispatch = [s.dispatch_s for s in sample if s.dispatch_s is not None]
            pct = {
                name: {q: _quantile(values, q) for q in (0.5, 0.9, 0.99)} | {"n": len(values)}
                for name, values in (("queue wait", waits), ("dispatch", dispatch))
            }
            return self._render(
                request,
                "overview.html",
                who,
                counts=counts,
                chart=throughput_chart(buckets, now),
                finished=sum(b.count for b in buckets),
                pct=pct,
                circuits=circuits,
                gate=gate,
                now=now,
                sample_cap=LATENCY_SAMPLE,
            )

        return await self._page(request, build)

    # -- labs -------------------------------------------------------------------------------------------------------------
    async def labs(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            runner = self.config.labs
            return self._render(
                request,
                "labs.html",
                who,
                catalog=runner.catalog() if runner is not None else [],
                enabled=runner is not None,
                allowed=self._may_run_labs(who),
                current=runner.current() if runner is not None else None,
            )

        return await self._page(request, build)

    async def lab(self, request: Request) -> Response:
        async def build(who: Principal) -> Response:
            runner = self.config.labs
            name = request.path_params["name"]
            lab = runner.lab(name) if runner is not None else None
            if lab is None:
                raise PageError(404, f"There is no lab {name[:40]!r}.")
            return self._render(request, "lab.html", who, lab=lab, allowed=self._may_run_labs(who))

        return await self._page(request, build)

    async def lab_start(self, request: Request) -> Response:
        runner = self.config.labs
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if runner is None:
            return JSONResponse({"detail": "labs are off on this gateway (TENURE_UI_LABS=off)"}, 404)
        if not self._may_run_labs(who):
            return JSONResponse({"detail": "only the admin starts a lab (they start processes on this machine)"}, 403)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"detail": "the body is a JSON object of the lab's parameters"}, 422)
        try:
            run = await runner.start(request.path_params["name"], body)
        except LookupError as exc:
            return JSONResponse({"detail": str(exc)}, 404)
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        except RuntimeError as exc:
            return JSONResponse({"detail": str(exc)}, 409)
        return JSONResponse({"lab": run.name, "run": run.id, "params": run.params}, 202)

    async def lab_stop(self, request: Request) -> Response:
        runner = self.config.labs
        try:
            who = self._check_change(request)
        except PageError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if runner is None or not self._may_run_labs(who):
            return JSONResponse({"detail": "no lab to stop"}, 404)
        stopped = await runner.stop(request.path_params["name"])
        return JSONResponse({"stopped": stopped})

    async def lab_events(self, request: Request) -> Response:
        runner = self.config.labs
        who = self._who(request)
        if who is None or runner is None or not self._may_run_labs(who):
            return JSONResponse({"detail": "not found"}, 404)
        return runner.stream(request.path_params["name"], request.headers.get("last-event-id"))
