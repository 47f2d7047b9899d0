"""The audit chain and the effect journal: what one job's executions did, written fenced by their owners.

    AuditRecord   one tool call, piece of evidence or usage report of an execution, ordered by (epoch, seq)
    StepRecord    one journaled step of a job (`ctx.step`): begun, done, or resolved by a later attempt
    Price         a model's price per 1,000 input and output tokens (TENURE_PRICES)

A job has one audit across its attempts: every execution adds its records under its own epoch, and nothing an
earlier execution wrote is removed by a retry (docs/audit.md). The journal is keyed by (job, step key), so a
later attempt finds what an earlier one recorded (docs/journal.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tenure.contracts.errors import ConfigError
from tenure.contracts.json_settings import finite_number, parse_json_object
from tenure.contracts.types import Fence

RECORD_KINDS = ("tool_call", "evidence", "usage", "requeue")
STEP_STATES = ("started", "done", "resolved")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit record an execution writes (fenced, like its events): `kind` is `tool_call` (name: the tool),
    `evidence` (name: its kind) or `usage` (name: the model, or ""); `data_json` is the record's JSON body.
    `started_at` / `ended_at` are the worker's clock (a tool call is timed where it runs; nothing is written
    when it starts)."""

    fence: Fence
    execution_id: str
    seq: int
    kind: str
    name: str
    data_json: str
    started_at: float | None = None
    ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """An audit record as read back: `ts` is the database clock at its write."""

    job_id: str
    epoch: int
    seq: int
    execution_id: str | None  # None: written by the store itself (a requeue's edit)
    kind: str
    name: str
    data: Any
    started_at: float | None
    ended_at: float | None
    ts: float

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "seq": self.seq, "execution_id": self.execution_id}
        out["kind"] = self.kind
        if self.kind == "tool_call":
            out |= {"name": self.name} | (self.data if isinstance(self.data, dict) else {"data": self.data})
            out |= {"started_at": self.started_at, "ended_at": self.ended_at}
            if self.started_at is not None and self.ended_at is not None:
                out["duration_s"] = round(self.ended_at - self.started_at, 6)
        elif self.kind == "evidence":
            out |= {"evidence_kind": self.name, "content": self.data}
        elif self.kind == "requeue":
            out |= self.data if isinstance(self.data, dict) else {"data": self.data}
        else:
            out |= {"model": self.name or None, "counts": self.data}
        out["ts"] = self.ts
        return out


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a job's journal. `state`: `started` (begun, no end recorded), `done` (its function returned
    `result`), `resolved` (an earlier attempt never recorded its end; a later one recorded `result` through
    `ctx.resolve_step`). `epoch` / `execution_id` / `started_at` are those of the begin; `ended_at` the database
    clock of the end."""

    job_id: str
    key: str
    state: str
    epoch: int
    execution_id: str
    started_at: float
    ended_at: float | None
    result_json: str | None

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state,
            "epoch": self.epoch,
            "execution_id": self.execution_id,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "result": self.result,
        }


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """A job's budget (limit name -> amount: `tool_calls`, `tokens`, `cost`, `wall_s`) and what its executions
    used of each so far (`wall_s`: the run time of its ended executions)."""

    limits: dict[str, float]
    used: dict[str, float]


BUDGET_LIMITS = ("tool_calls", "tokens", "cost", "wall_s")
BUDGET_MAX: Mapping[str, int] = MappingProxyType({"tool_calls": 10**9, "tokens": 10**12, "cost": 10**12, "wall_s": 10**12})
"""The largest value of each limit; `tool_calls` and `tokens` are whole numbers >= 1, `cost` and `wall_s` > 0
(the same ranges `control.models.Budget` holds a submitted budget to)."""
_WHOLE = ("tool_calls", "tokens")


def check_budget(budget: Mapping[str, Any], what: str) -> tuple[tuple[str, float], ...]:
    """An agent's default budget (`@app.agent(budget=...)`) held to a job budget's ranges, as sorted (limit,
    amount) pairs; `ConfigError` naming `what` and the limit otherwise."""
    if not isinstance(budget, Mapping):
        raise ConfigError(f"{what}: budget must be a dict of limits ({', '.join(BUDGET_LIMITS)})")
    out = []
    for name, value in budget.items():
        if name not in BUDGET_MAX:
            raise ConfigError(f"{what}: budget has no limit {name!r} (limits: {', '.join(BUDGET_LIMITS)})")
        whole = name in _WHOLE
        if not finite_number(value) or (whole and float(value) != int(value)):
            raise ConfigError(f"{what}: budget {name} must be a {'whole ' if whole else ''}number, not {value!r}")
        if not ((value >= 1) if whole else (value > 0)) or value > BUDGET_MAX[name]:
            low = "from 1" if whole else "above 0 and"
            raise ConfigError(f"{what}: budget {name} must be {low} up to {BUDGET_MAX[name]:g}, not {value!r}")
        out.append((name, int(value) if whole else float(value)))
    return tuple(sorted(out))


def job_budget(agent_default: Iterable[tuple[str, float]], own: Mapping[str, float] | None) -> dict[str, float] | None:
    """The budget a job runs with: its agent's default with the job's own limits over it, limit by limit (a job
    that names `tokens` keeps the agent's `tool_calls`); None when neither gives a limit (docs/budgets.md)."""
    out = dict(agent_default) | dict(own or {})
    return out or None


def budget_use(budget_json: str, row: Mapping[str, Any]) -> BudgetUse:
    return BudgetUse(json.loads(budget_json), {k: float(row[k] or 0) for k in BUDGET_LIMITS})


USAGE_GROUPS = ("tenant", "agent", "model")
USAGE_COUNTERS = ("reports", "input_tokens", "output_tokens", "cost_usd")


def usage_row(key: str | None, row: Mapping[str, Any]) -> dict[str, Any]:
    """One group of a usage report: its key and the sums of the usage records in it."""
    out: dict[str, Any] = {"key": key}
    out |= {c: (int(row[c]) if c == "reports" else float(row[c] or 0)) for c in USAGE_COUNTERS}
    return out


# -- usage and prices -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price in USD per 1,000 tokens, of its input and of its output."""

    input: float
    output: float

    def cost(self, input_tokens: float, output_tokens: float) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1000.0


def parse_prices(text: str, name: str = "TENURE_PRICES") -> dict[str, Price]:
    """`{"gpt-4o": {"input": 0.0025, "output": 0.01}, ...}`: USD per 1,000 tokens of each model. Both prices
    are required, finite and >= 0; nothing else is accepted."""
    return parse_json_object(text, name, '{"model": {"input": 0.5, "output": 1.5}}', _price)


def _price(p: Any) -> Price:
    if not isinstance(p, dict) or set(p) != {"input", "output"}:
        raise ValueError('needs exactly "input" and "output" (USD per 1,000 tokens)')
    if not all(finite_number(p[k]) and p[k] >= 0 for k in ("input", "output")):
        raise ValueError("needs prices that are finite numbers >= 0")
    return Price(float(p["input"]), float(p["output"]))


def priced(model: str | None, counts: Mapping[str, float], prices: Mapping[str, Price]) -> dict[str, float]:
    """`counts` with `cost_usd` added from `prices` when the model has a price and the counts carry none."""
    out = dict(counts)
    price = prices.get(model) if model is not None else None
    if price is not None and "cost_usd" not in out:
        out["cost_usd"] = price.cost(out.get("input_tokens", 0), out.get("output_tokens", 0))
    return out


def sum_usage(reports: Iterable[Any]) -> dict[str, float]:
    """The totals of usage reports (each a dict of counter -> number): every counter summed."""
    totals: dict[str, float] = {}
    for counts in reports:
        if not isinstance(counts, dict):
            continue
        for k, v in counts.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                totals[k] = totals.get(k, 0) + v
    return totals
