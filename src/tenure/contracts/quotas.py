"""Quota configuration as plain data: one `QuotaSpec` per named key, and the text format that declares them.

    TENURE_QUOTAS='llm:gpt-4o=8,llm:mock=8/fail-open,gpu-pool=2'

Each entry is `key=limit`, optionally followed by `/fail-closed` (the default) or `/fail-open`. Keys may
contain `:` (`llm:gpt-4o:tenant-a`), so the separator between key and limit is the *last* `=`. The same
quotas can be declared in `tenure.toml`:

    [quotas]
    "llm:mock" = 8
    "llm:gpt-4o" = { limit = 8, on_failure = "fail-open" }

A malformed entry is a `ConfigError`: a process never starts on a quota it does not understand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenure.contracts.errors import ConfigError

FAIL_CLOSED = "fail-closed"
FAIL_OPEN = "fail-open"
_POLICIES = (FAIL_CLOSED, FAIL_OPEN)
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,199}$")


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """The global limit of one named quota key and what to do when the lease backend cannot answer."""

    key: str
    limit: int
    on_failure: str = FAIL_CLOSED

    def __post_init__(self) -> None:
        if not _KEY.match(self.key):
            raise ConfigError(f"quota key {self.key!r}: use letters, digits and _.:/@- (at most 200 chars)")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigError(f"quota {self.key!r}: the limit must be a whole number >= 1, not {self.limit!r}")
        if self.on_failure not in _POLICIES:
            raise ConfigError(
                f"quota {self.key!r}: on_failure must be {FAIL_CLOSED} or {FAIL_OPEN}, not {self.on_failure!r}"
            )

    @property
    def fail_open(self) -> bool:
        """True when the key lets calls through (uncounted) while the lease backend is down."""
        return self.on_failure == FAIL_OPEN


def parse_quotas(text: str, source: str = "TENURE_QUOTAS") -> dict[str, QuotaSpec]:
    """Parse `key=limit[/policy],...` into specs by key. Empty text declares no quota."""
    out: dict[str, QuotaSpec] = {}
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, rest = entry.rpartition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}: {entry!r} is not key=limit (e.g. llm:gpt-4o=8)")
        limit_text, _, policy = rest.partition("/")
        try:
            limit = int(limit_text.strip())
        except ValueError:
            raise ConfigError(f"{source}: {entry!r}: the limit {limit_text!r} is not a whole number") from None
        spec = QuotaSpec(key.strip(), limit, policy.strip() or FAIL_CLOSED)
        if spec.key in out:
            raise ConfigError(f"{source}: quota {spec.key!r} is declared twice")
        out[spec.key] = spec
    return out


def quotas_from_table(table: Mapping[str, Any], source: str = "tenure.toml [quotas]") -> dict[str, QuotaSpec]:
    """Parse the `[quotas]` table of tenure.toml: each value a limit, or `{limit = N, on_failure = "..."}`."""
    out: dict[str, QuotaSpec] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            unknown = set(value) - {"limit", "on_failure"}
            if unknown:
                raise ConfigError(f"{source}: quota {key!r} has unknown fields {sorted(unknown)}")
            if "limit" not in value:
                raise ConfigError(f"{source}: quota {key!r} has no limit")
            out[key] = QuotaSpec(key, value["limit"], value.get("on_failure", FAIL_CLOSED))
        else:
            out[key] = QuotaSpec(key, value)
    return out


def format_quotas(specs: Mapping[str, QuotaSpec]) -> str:
    """The `TENURE_QUOTAS` text of `specs` (what `parse_quotas` reads back)."""
    return ",".join(f"{s.key}={s.limit}" + ("/fail-open" if s.fail_open else "") for s in specs.values())
