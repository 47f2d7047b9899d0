"""One execution's audit records and journal steps (`ExecutionAudit`): the half of its port behind
`ctx.tool_call`, `ctx.evidence`, `ctx.usage`, `ctx.step` and `ctx.resolve_step` (docs/audit.md, docs/journal.md).

Audit records are queued on the completer and written with the execution's events, fenced by the same check
(no round trip of their own; evidence waits for its batch to be durable). A journal step costs three round
trips the first time it runs — the job's journal is read once per execution, at its first step — and none when
a later attempt finds it done: its begin is durable before `fn` runs, its end (with the JSON result) before
`step` returns. Every write matches nothing once the execution's fence lost the job; the execution then stops,
as for any write that found it no longer owns its job.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.audit import AuditRecord, BudgetUse, Price, StepRecord, priced
from tenure.contracts.errors import BudgetExhausted, PermanentError, StepUnknown, StoreUnavailable
from tenure.contracts.store import Store
from tenure.contracts.text import describe_error, dumps
from tenure.contracts.types import Fence
from tenure.worker.byref import by_reference
from tenure.worker.completer import Completer
from tenure.worker.config import WorkerConfig

log = logging.getLogger("tenure.worker")
_STORE_RETRIES = 5


class _Env(Protocol):
    @property
    def store(self) -> Store: ...
    @property
    def completer(self) -> Completer: ...
    @property
    def config(self) -> WorkerConfig: ...
    @property
    def artifacts(self) -> ArtifactStore | None: ...


class Execution(Protocol):
    """What of its execution (worker/execution.py) the audit uses."""

    unwritten: int

    @property
    def env(self) -> _Env: ...
    @property
    def fence(self) -> Fence: ...
    @property
    def execution_id(self) -> str: ...
    def check(self) -> None: ...
    def lose(self) -> None: ...
    async def flush(self) -> None: ...
    async def to_thread(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...
    def record_external(self, kind: str, seconds: float) -> None: ...


class ExecutionAudit:
    """The audit and journal of one execution (see the module docstring)."""

    __slots__ = ("_began", "_budget", "_prices", "_seq", "_steps", "_used", "_x")

    def __init__(self, execution: Execution, prices: Mapping[str, Price], began: float) -> None:
        self._x = execution
        self._prices = prices
        self._seq = 0  # this execution's audit records, 1, 2, ... under its epoch
        self._steps: dict[str, StepRecord] | None = None  # the job's journal, read at the first step
        self._budget: BudgetUse | bool | None = False  # False: not read yet; None: the job has no budget
        self._used = {"tool_calls": 0.0, "tokens": 0.0, "cost": 0.0}  # by this execution
        self._began = began  # the execution's start (time.monotonic())

    # -- audit records ----------------------------------------------------------------------------------------------
    def queue(self, kind: str, name: str, data_json: str, started_at: float | None, ended_at: float | None) -> None:
        x = self._x
        x.check()
        self._seq += 1
        x.env.completer.record(AuditRecord(x.fence, x.execution_id, self._seq, kind, name, data_json, started_at, ended_at))
        x.unwritten += 1

    async def audit(
        self, kind: str, name: str, data_json: str, started_at: float | None, ended_at: float | None, durable: bool
    ) -> None:
        x = self._x
        if kind == "evidence" and x.env.artifacts is not None:  # over the threshold: by reference (artifacts.md)
            x.check()
            stub_like = '"$artifact"' in data_json
            data_json = await by_reference(x.env.config, x.env.artifacts, x.fence.job_id, data_json, stub_like, kind)
        self.queue(kind, name, data_json, started_at, ended_at)
        if kind == "tool_call":
            self._used["tool_calls"] += 1
        if durable or self._x.unwritten >= self._x.env.config.event_buffer:
            await self._x.flush()

    def record_external(self, kind: str, seconds: float) -> None:
        self._x.record_external(kind, seconds)

    def usage(self, counts: dict[str, float], model: str | None) -> dict[str, float]:
        """The counts with their cost from the price table; queues their usage record."""
        counts = priced(model, counts, self._prices)
        self.queue("usage", model or "", dumps(counts), None, None)
        self._used["tokens"] += counts.get("input_tokens", 0) + counts.get("output_tokens", 0)
        self._used["cost"] += counts.get("cost_usd", 0)
        return counts

    # -- the budget (docs/budgets.md) -------------------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Before a tool call or a step: raise `BudgetExhausted` when the job reached a limit. The budget and what
        earlier executions used of it are read once, at the execution's first checkpoint."""
        x = self._x
        x.check()
        if self._budget is False:
            self._budget = await x.env.store.read_budget(x.fence.job_id)
        budget = self._budget
        if not isinstance(budget, BudgetUse):
            return
        for limit, allowed in budget.limits.items():
            used = budget.used.get(limit, 0.0) + self._used.get(limit, 0.0)
            if limit == "wall_s":
                used += time.monotonic() - self._began
            if used >= allowed:
                await asyncio.sleep(0)  # a handler that catches it in a loop still lets the worker run
                raise BudgetExhausted(limit, round(used, 6), allowed)

    # -- the journal ------------------------------------------------------------------------------------------------
    async def _journal(self) -> dict[str, StepRecord]:
        if self._steps is None:
            steps = await self._x.env.store.read_steps(self._x.fence.job_id)
            if self._steps is None:  # two first steps at once (gather): the first read wins, the cache is one
                self._steps = {s.key: s for s in steps}
        return self._steps

    def _known(self, step: StepRecord) -> Any:
        """The answer for a key the journal already has: its result, or `StepUnknown`."""
        if step.state != "started":
            return json.loads(step.result_json) if step.result_json is not None else None
        if step.execution_id != self._x.execution_id:
            raise StepUnknown(step.key, step.started_at)
        raise ValueError(f"step {step.key!r} is already running in this execution (two steps with one key)")

    def _lost(self) -> None:
        self._x.lose()
        self._x.check()

    async def step(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        x = self._x
        x.check()
        steps = await self._journal()
        if key in steps:
            return self._known(steps[key])
        await self.checkpoint()  # a step found done costs nothing; one that would run is new work
        if key in steps:  # the same key began while the checkpoint read the budget
            return self._known(steps[key])
        # Taken in the cache before the round trip: a concurrent call with the same key is told it is running.
        steps[key] = StepRecord(x.fence.job_id, key, "started", x.fence.epoch, x.execution_id, time.time(), None, None)
        try:
            began = await x.env.store.begin_step(x.fence, x.execution_id, key)
        except BaseException:
            steps.pop(key, None)
            raise
        if began is None:
            steps.pop(key, None)
            self._lost()
        assert began is not None
        steps[key] = began
        if began.execution_id != x.execution_id or began.state != "started":  # it was in the journal already
            return self._known(began)
        try:
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args)
            else:
                result = await x.to_thread(fn, *args)
        except Exception:
            # fn raised: it is not done, and the journal records completions only (docs/journal.md)
            try:
                if await x.env.store.clear_step(x.fence, x.execution_id, key):
                    steps.pop(key, None)
            except StoreUnavailable as exc:
                log.warning("job %s: clearing step %r failed (%s); it stays begun", x.fence.job_id, key, exc)
            raise
        try:
            result_json = dumps(result)
        except (TypeError, ValueError, RecursionError) as exc:
            # Its effect happened, so the step stays begun: a later attempt is told it is unknown.
            raise PermanentError(f"the result of step {key!r} cannot be stored: {describe_error(exc)}") from exc
        await self._end(key, result_json, lambda: x.env.store.end_step(x.fence, x.execution_id, key, result_json))
        steps[key] = StepRecord(
            x.fence.job_id, key, "done", x.fence.epoch, x.execution_id, began.started_at, None, result_json
        )
        return json.loads(result_json)

    async def resolve_step(self, key: str, result_json: str) -> None:
        x = self._x
        x.check()
        step = (await self._journal()).get(key)
        if step is None or step.state != "started" or step.execution_id == x.execution_id:
            raise ValueError(f"step {key!r} is not a step an earlier attempt left unknown; nothing to resolve")
        await self._end(key, result_json, lambda: x.env.store.resolve_step(x.fence, key, result_json))
        assert self._steps is not None
        self._steps[key] = StepRecord(
            x.fence.job_id, key, "resolved", step.epoch, step.execution_id, step.started_at, None, result_json
        )

    async def _end(self, key: str, result_json: str, write: Callable[[], Any]) -> None:
        """Write a step's end, through short store outages: a step whose end is not written is unknown to the
        next attempt. A write that matches nothing after an outage may have committed before it: the journal
        says which."""
        x = self._x
        for attempt in range(_STORE_RETRIES):
            try:
                if await write():
                    return
                if attempt == 0:
                    self._lost()
                rows = {s.key: s for s in await x.env.store.read_steps(x.fence.job_id)}
                if key in rows and rows[key].state != "started" and rows[key].result_json is not None:
                    return
                self._lost()
            except StoreUnavailable as exc:
                if attempt == _STORE_RETRIES - 1:
                    raise
                log.warning("job %s: recording the end of step %r failed (%s); retrying", x.fence.job_id, key, exc)
                await asyncio.sleep(0.1 * 2**attempt)
