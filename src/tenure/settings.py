"""Typed settings, read once from `TENURE_*` environment variables and overridden by CLI flags.

An unknown `TENURE_*` variable, a malformed value or an inconsistent combination is an error at start-up:
nothing runs on a configuration it does not understand. docs/configuration.md lists every setting.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tenure.contracts.errors import ConfigError
from tenure.contracts.quotas import QuotaSpec, parse_quotas, quotas_from_table


def _pos_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{name} must be a positive, finite number, not {text!r}")
    return value


def _pos_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {text!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, not {value}")
    return value


def _choice(*options: str) -> Any:
    def parse(name: str, text: str) -> str:
        value = text.strip().upper() if options[0].isupper() else text.strip().lower()
        if value not in options:
            raise ConfigError(f"{name} must be one of {', '.join(options)}, not {text!r}")
        return value

    return parse


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(f"{name} is empty")
    return text.strip()


def _tags(name: str, text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _optional(name: str, text: str) -> str | None:
    return text.strip() or None


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of a Tenure process. Field `x` is read from `TENURE_X`."""

    database_url: str = "sqlite:///./tenure.db"
    app: str = "tenure.demos.examples:app"
    heartbeat_s: float = 5.0
    claim_ttl_s: float = 15.0
    sweep_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    poll_s: float = 1.0
    concurrency: int = 10
    capabilities: tuple[str, ...] = ()
    claim_mode: str = "one_step"
    max_input_bytes: int = 1024 * 1024
    default_deadline_s: float = 300.0
    sqlite_synchronous: str = "FULL"
    log_level: str = "info"
    log_format: str = "auto"
    faults: str | None = None
    # Read by later layers (the gateway, Redis, quotas, the example `chat` agent); validated here too.
    redis_url: str | None = None
    model_url: str = "http://127.0.0.1:8001/v1"
    # Observability (docs/observability.md): loop-lag sampling, the stall log, lag-aware liveness.
    lag_interval_s: float = 0.05
    stall_threshold_s: float = 0.25
    degraded_lag_s: float = 0.5
    degraded_for_s: float = 2.0
    # The gateway: admission caps and the per-agent circuit breaker (DESIGN.md, "Admission at the gateway"),
    # and the gateway URL the CLI's client commands talk to (unset: they use the store directly).
    max_queued: int = 500
    max_queued_per_tenant: int = 500
    breaker_threshold: int = 3
    breaker_window_s: float = 600.0
    breaker_open_s: float = 60.0
    url: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    # Global quotas (docs/quotas.md): TENURE_QUOTAS='llm:gpt-4o=8,llm:mock=8/fail-open', over tenure.toml.
    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)
    # Every Redis key and channel of this deployment starts with this prefix (two deployments, or test runs,
    # can share one Redis server).
    redis_prefix: str = "tenure:"

    def __post_init__(self) -> None:
        if self.claim_ttl_s < 3 * self.heartbeat_s:
            raise ConfigError(
                f"TENURE_CLAIM_TTL_S ({self.claim_ttl_s:g}) must be at least 3 heartbeats "
                f"(3 × TENURE_HEARTBEAT_S = {3 * self.heartbeat_s:g}): one late heartbeat must not lose a job"
            )
        scheme = self.database_url.split(":", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgres", "postgresql+asyncpg"):
            raise ConfigError(f"TENURE_DATABASE_URL {self.database_url!r}: expected sqlite:///path.db or postgresql://...")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `TENURE_*` variables, then apply non-None `overrides` (from CLI flags)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        for key, text in env.items():
            if not key.startswith("TENURE_"):
                continue
            name = key[len("TENURE_") :].lower()
            if name in _PARSERS:
                values[name] = _PARSERS[name](key, text)
            elif name in _OTHER_LAYERS:
                extra[name] = text
            else:
                raise ConfigError(f"unknown setting {key} (see docs/configuration.md for the list)")
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        return cls(**values, extra=extra)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


_PARSERS: dict[str, Any] = {
    "database_url": _text,
    "app": _text,
    "heartbeat_s": _pos_float,
    "claim_ttl_s": _pos_float,
    "sweep_interval_s": _pos_float,
    "drain_timeout_s": _pos_float,
    "poll_s": _pos_float,
    "concurrency": _pos_int,
    "capabilities": _tags,
    "claim_mode": _choice("one_step", "two_step"),
    "max_input_bytes": _pos_int,
    "default_deadline_s": _pos_float,
    "sqlite_synchronous": _choice("FULL", "NORMAL"),
    "log_level": _choice("debug", "info", "warning", "error"),
    "log_format": _choice("auto", "json", "console"),
    "faults": _optional,
    "redis_url": _optional,
    "model_url": _text,
    "lag_interval_s": _pos_float,
    "stall_threshold_s": _pos_float,
    "degraded_lag_s": _pos_float,
    "degraded_for_s": _pos_float,
    "max_queued": _pos_int,
    "max_queued_per_tenant": _pos_int,
    "breaker_threshold": _pos_int,
    "breaker_window_s": _pos_float,
    "breaker_open_s": _pos_float,
    "url": _optional,
    "quotas": lambda name, text: parse_quotas(text, name),
    "redis_prefix": _text,
}
# Variables owned by layers that parse them themselves (gateway keys); known, so not an error.
_OTHER_LAYERS = frozenset(
    {
        "api_keys",
        "api_keys_file",
        "admin_key",
        "api_key",
        "metrics_port",
        # The dashboard and browsers as clients (gateway/ui, gateway/cors.py).
        "ui",
        "ui_secret",
        "ui_session_s",
        "ui_labs",
        "cors_origins",
    }
)


def load_quota_file(path: str = "tenure.toml") -> dict[str, QuotaSpec]:
    """The `[quotas]` table of a tenure.toml file (`{}` when the file does not exist). Blocking file I/O:
    call it before the event loop starts, or through `asyncio.to_thread`."""
    import tomllib

    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    unknown = set(document) - {"quotas"}
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)} (known: quotas)")
    table = document.get("quotas", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [quotas] must be a table")
    return quotas_from_table(table, f"{path} [quotas]")
