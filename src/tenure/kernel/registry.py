"""The app object agent authors create, and its registry of agents.

    app = Tenure()

    @app.agent("summarize", requires={"text"}, timeout=600, max_attempts=3, budget={"tokens": 200_000})
    async def summarize(ctx: Context, input: dict) -> dict: ...

A plain `def` handler is run through the blocking-call adapter, never on the event loop.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tenure.contracts.audit import check_budget
from tenure.contracts.errors import ConfigError
from tenure.contracts.profile import check_route_weights, parse_features
from tenure.contracts.types import MULTITASK, AgentSpec

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_TAG = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Agent:
    """One registered agent: its spec and its handler."""

    spec: AgentSpec
    handler: Handler
    is_async: bool


def check_tags(tags: Iterable[str], what: str) -> frozenset[str]:
    """Validate capability tags (letters, digits and `_.:/-`; no commas)."""
    out = frozenset(tags)
    for t in out:
        if not isinstance(t, str) or not _TAG.match(t):
            raise ConfigError(f"{what}: {t!r} is not a valid capability tag (letters, digits, _.:/-, 1-64 chars)")
    return out


def _timeout_setting(value: object, agent: str, what: str) -> float | Literal[False] | None:
    """`soft_timeout=` / `hard_timeout=`: positive seconds, False (off), or None / 0 (the learned default)."""
    if value is None or value is False:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"agent {agent!r}: {what} must be a positive number of seconds, 0, None or False, not {value!r}")
    return None if value == 0 else float(value)


class Tenure:
    """An application: a named set of agents that workers run and gateways admit."""

    def __init__(self, name: str = "tenure") -> None:
        self.name = name
        self._agents: dict[str, Agent] = {}
        self._warmups: list[Handler] = []

    def agent(
        self,
        name: str | None = None,
        *,
        requires: Iterable[str] = (),
        timeout: float | None = None,
        max_attempts: int = 3,
        retry_safe: bool = False,
        priority: int = 0,
        worker_quota: str | None = None,
        key_limit: int = 1,
        multitask: str = "enqueue",
        max_queued: int | None = None,
        degrade_to: str | None = None,
        modes: Iterable[str] = (),
        budget: Mapping[str, float] | None = None,
        soft_timeout: float | Literal[False] | None = None,
        hard_timeout: float | Literal[False] | None = None,
        prefers: Iterable[str] = (),
        route_weights: Iterable[float] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as an agent.

        `requires`: capability tags a worker must have to run it. `timeout`: seconds before an execution is
        stopped and counted as a retryable failure. `max_attempts`: executions before the job is dead.
        `retry_safe`: a run lost mid-way (its owner stopped heartbeating) is requeued as a new attempt, counted
        against `max_attempts`, instead of ending `lost`: declare it when its effects are idempotent or journaled
        with `ctx.step` (the new attempt gets completed steps' results without running them; docs/journal.md).
        `worker_quota`: a configured global quota (e.g. "gpu-pool") of which a worker must hold a slot before
        it claims a job of this agent; the slot is held for the whole execution (docs/quotas.md).
        `key_limit`: how many jobs of one concurrency key run at once; `multitask`: what a job of a busy key does
        by default (enqueue, reject, interrupt, drop_queued). `max_queued`: the most jobs of this agent waiting
        to start, counted in the store; when full, jobs go to `degrade_to` (another agent) or are refused (429).
        `modes`: the modes a job may ask for, best first; the handler reads `ctx.mode`.
        See docs/scheduling.md. `budget`: the default limits of its jobs, the keys of a job's `budget=` on submit
        (`tool_calls`, `tokens`, `cost`, `wall_s`); a job's own budget overrides them limit by limit
        (docs/budgets.md). `soft_timeout`: seconds after which a worker logs and counts a still-running execution
        (`tenure_soft_timeouts_total`) without interrupting it; None or 0: the p95 of the agent's recent durations
        on that worker; False: none. `hard_timeout`: seconds after which the handler is cancelled and the attempt
        fails `timeout`, never past the job's `timeout`; None or 0: 2 x the p99 of recent durations, within
        TENURE_HARD_TIMEOUT_FLOOR_S and `timeout` (nothing derived without a `timeout`); False: only `timeout`.
        `prefers`: features a worker offering them is preferred for (a bonus to its score,
        merged with a job's own `prefers`); `route_weights`: the weights of the routing score (load, success rate,
        latency; three non-negative numbers, not all 0; default 0.4, 0.4, 0.2). See docs/routing.md.
        """

        mode_names = tuple(modes)

        def register(fn: Handler) -> Handler:
            agent_name = name or fn.__name__
            if not _NAME.match(agent_name):
                raise ConfigError(f"invalid agent name {agent_name!r}")
            if agent_name in self._agents:
                raise ConfigError(f"agent {agent_name!r} is registered twice")
            if max_attempts < 1:
                raise ConfigError(f"agent {agent_name!r}: max_attempts must be at least 1")
            if timeout is not None and timeout <= 0:
                raise ConfigError(f"agent {agent_name!r}: timeout must be positive")
            if key_limit < 1:
                raise ConfigError(f"agent {agent_name!r}: key_limit must be at least 1")
            if multitask not in MULTITASK:
                raise ConfigError(f"agent {agent_name!r}: multitask must be one of {', '.join(MULTITASK)}")
            if len(set(mode_names)) != len(mode_names) or not all(_NAME.match(m) for m in mode_names):
                raise ConfigError(f"agent {agent_name!r}: modes must be distinct names")
            if max_queued is not None and max_queued < 0:
                raise ConfigError(f"agent {agent_name!r}: max_queued must be at least 0")
            default_budget = () if budget is None else check_budget(budget, f"agent {agent_name!r}")
            soft_s = _timeout_setting(soft_timeout, agent_name, "soft_timeout")
            hard_s = _timeout_setting(hard_timeout, agent_name, "hard_timeout")
            if isinstance(hard_s, float) and timeout is not None and hard_s > timeout:
                raise ConfigError(f"agent {agent_name!r}: hard_timeout ({hard_s:g}) is past its timeout ({timeout:g})")
            preferred = frozenset(parse_features(prefers, f"agent {agent_name!r}: prefers"))
            weights = None if route_weights is None else check_route_weights(route_weights, agent_name)
            spec = AgentSpec(
                name=agent_name,
                max_attempts=max_attempts,
                timeout_s=timeout,
                retry_safe=retry_safe,
                requires=check_tags(requires, f"agent {agent_name!r}"),
                priority=priority,
                worker_quota=worker_quota,
                key_limit=key_limit,
                multitask=multitask,
                max_queued=max_queued,
                degrade_to=degrade_to,
                modes=mode_names,
                budget=default_budget,
                soft_timeout_s=soft_s,
                hard_timeout_s=hard_s,
                prefers=preferred,
                route_weights=weights,
            )
            self._agents[agent_name] = Agent(spec, fn, inspect.iscoroutinefunction(fn))
            return fn

        return register

    def warmup(self, fn: Handler) -> Handler:
        """Register the decorated function (no arguments; async, or sync and run in a thread) to run in each worker
        before it claims anything: the worker shows `warming` meanwhile, then `active` (docs/routing.md). One that
        raises stops the worker (exit 1) before it took a job."""
        if not callable(fn):
            raise ConfigError("@app.warmup decorates a function")
        self._warmups.append(fn)
        return fn

    @property
    def warmups(self) -> list[Handler]:
        """The warm-up functions, in the order they were registered."""
        return list(self._warmups)

    def get(self, name: str) -> Agent | None:
        """The agent registered under `name`, if any."""
        return self._agents.get(name)

    @property
    def agents(self) -> dict[str, Agent]:
        """Every registered agent by name."""
        return dict(self._agents)

    def specs(self) -> dict[str, AgentSpec]:
        """The specs the control plane needs, by agent name."""
        return {n: a.spec for n, a in self._agents.items()}
