"""The one reader of settings whose value is a JSON object of name -> entry:

    TENURE_PRICES                  {"gpt-4o": {"input": 0.0025, "output": 0.01}}        (contracts/audit.py)
    TENURE_TENANT_BUDGETS          {"acme": {"tokens": 1000000, "window_s": 86400}}     (control/tenant_budgets.py)
    TENURE_TENANT_RETENTION_DAYS   {"acme": 7, "audit-heavy": 365}                      (worker/config.py)

Each setting brings only its per-entry rule (`entry`); reading the text, requiring an object and naming the
setting and the entry in every refusal happen here, once, so the three refuse a bad value in the same words.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from tenure.contracts.errors import ConfigError

T = TypeVar("T")


def parse_json_object(text: str, name: str, example: str, entry: Callable[[Any], T]) -> dict[str, T]:
    """The JSON object `text` of setting `name` with each value read by `entry` (empty text: `{}`). `entry`
    returns the parsed value or raises `ValueError` saying what the entry needs, which becomes a `ConfigError`
    reading "`name`: 'key' <what it needs>". `example` is a valid value, quoted in the errors of the whole text."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{name} is not JSON ({exc}); expected an object such as {example}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{name} must be a JSON object, such as {example}")
    out: dict[str, T] = {}
    for key, value in raw.items():
        try:
            out[str(key)] = entry(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {key!r} {exc}") from None
    return out


def finite_number(value: Any) -> bool:
    """A JSON number that is finite (`true` is not a number here, as JSON means it)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
