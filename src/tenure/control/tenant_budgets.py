"""Tenant budgets (`TENURE_TENANT_BUDGETS`, docs/budgets.md): a tenant whose usage records of the last window
reach its token or cost limit is refused new jobs at admission (`429`, with the reason).

    TENURE_TENANT_BUDGETS='{"acme": {"tokens": 1000000, "cost": 50, "window_s": 86400}}'

Only tenants named there pay for the check: one read of their usage in the window per admission.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tenure.contracts.json_settings import finite_number, parse_json_object
from tenure.contracts.store import Store
from tenure.control.gate import QueueFull

_KEYS = frozenset({"tokens", "cost", "window_s"})


@dataclass(frozen=True, slots=True)
class TenantBudget:
    """A tenant's limits on the usage its jobs report (`ctx.usage`) within a rolling window of `window_s`."""

    tokens: float | None = None
    cost: float | None = None
    window_s: float = 86400.0


class TenantBudgetExhausted(QueueFull):
    """The tenant's usage in its window reached a limit of its budget: no new job until it falls below (a 429)."""

    code = "tenant_budget_exhausted"


def parse_tenant_budgets(text: str, name: str = "TENURE_TENANT_BUDGETS") -> dict[str, TenantBudget]:
    """`{"tenant": {"tokens": N, "cost": USD, "window_s": S}}`: at least one of tokens and cost, each > 0;
    `window_s` > 0 (default 86400)."""
    return parse_json_object(text, name, '{"tenant": {"tokens": 1000000, "cost": 50}}', _budget)


def _budget(b: Any) -> TenantBudget:
    if not isinstance(b, dict) or not b or set(b) - _KEYS or not set(b) & {"tokens", "cost"}:
        raise ValueError("needs tokens and/or cost (and optionally window_s), nothing else")
    for k, v in b.items():
        if not finite_number(v) or v <= 0:
            raise ValueError(f"{k} must be a positive number")
    return TenantBudget(b.get("tokens"), b.get("cost"), float(b.get("window_s", 86400.0)))


async def check_tenant_budgets(store: Store, budgets: Mapping[str, TenantBudget], tenants: Iterable[str]) -> None:
    """Raise `TenantBudgetExhausted` when one of `tenants` has reached a limit of its budget."""
    for tenant in set(tenants):
        budget = budgets.get(tenant)
        if budget is None:
            continue
        window = budget.window_s
        groups = await store.usage_report(time.time() - window, 1e11, "tenant", tenant)
        used = groups[0] if groups else {"input_tokens": 0.0, "output_tokens": 0.0, "cost_usd": 0.0}
        tokens, cost = used["input_tokens"] + used["output_tokens"], used["cost_usd"]
        for limit, value, allowed in (("tokens", tokens, budget.tokens), ("cost", cost, budget.cost)):
            if allowed is not None and value >= allowed:
                raise TenantBudgetExhausted(
                    f"tenant {tenant!r} is over its {limit} budget: {value:g} used of {allowed:g} in the last {window:g} s",
                    max(1, int(min(window, 3600))),
                )
