"""Typed settings, read once from `TENURE_*` environment variables and overridden by CLI flags.

    Settings
    ├── store     StoreSettings     where the durable truth lives (TENURE_DATABASE_URL, TENURE_SQLITE_SYNCHRONOUS)
    ├── worker    WorkerConfig      how a worker claims, heartbeats, drains (worker/config.py: its rules live there)
    ├── limits    AdmissionLimits   what one request may ask for (control/admission.py)
    ├── gate      GateConfig        the queue caps and the circuit breaker (control/gate.py)
    ├── gateway   GatewaySettings   the dashboard, browsers as clients
    ├── redis     RedisSettings     the accelerator (TENURE_REDIS_URL, TENURE_REDIS_PREFIX)
    └── auth      AuthSettings      the gateway's API keys, and the key the CLI sends
    and the process's own: app, log_level, log_format, faults, model_url, url, metrics_port, quotas

Every variable is one row of `_TABLE`: its section, its field and its parser, so a name, a default and a rule are
each written once (the defaults are the sections' own; a cross-field rule lives in the section it concerns, e.g.
"the claim TTL is at least three heartbeats" in `WorkerConfig`). An unknown `TENURE_*` variable, a malformed
value or an inconsistent combination is an error at start-up: nothing runs on a configuration it does not
understand. docs/configuration.md lists every setting (tests/unit/test_docs.py checks it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tenure.contracts.audit import parse_prices
from tenure.contracts.errors import ConfigError
from tenure.contracts.profile import parse_capabilities, parse_features
from tenure.contracts.quotas import QuotaSpec, parse_quotas, quotas_from_table
from tenure.control.admission import AdmissionLimits
from tenure.control.gate import GateConfig
from tenure.control.tenant_budgets import parse_tenant_budgets
from tenure.worker.config import WorkerConfig, parse_tenant_retention

DEFAULT_APP = "tenure.demos.examples:app"
_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+asyncpg")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Where the durable truth lives."""

    database_url: str = "sqlite:///./tenure.db"
    sqlite_synchronous: str = "FULL"
    pg_command_timeout_s: float | None = 30.0
    """Each PostgreSQL statement's bound at the client (None: unbounded); migrations are not bounded."""
    artifacts_dir: str | None = None
    """The artifact store's directory (docs/artifacts.md); unset: `<SQLite file>.artifacts`, none on PostgreSQL."""
    artifacts_url: str | None = None
    """An S3-compatible bucket for the artifacts instead (`s3://BUCKET/PREFIX?endpoint=...`; docs/artifacts.md)."""

    def __post_init__(self) -> None:
        if self.database_url.split(":", 1)[0] not in _SQL_SCHEMES:
            raise ConfigError(f"TENURE_DATABASE_URL {self.database_url!r}: expected sqlite:///path.db or postgresql://...")
        if self.artifacts_url is not None:
            if not self.artifacts_url.startswith("s3://"):
                raise ConfigError("TENURE_ARTIFACTS_URL: expected s3://BUCKET/PREFIX?endpoint=...&region=...")
            if self.artifacts_dir is not None:
                raise ConfigError("set TENURE_ARTIFACTS_DIR or TENURE_ARTIFACTS_URL, not both")


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Redis, the accelerator (quota leases, the ready index, live hints); never the truth."""

    url: str | None = None
    prefix: str = "tenure:"
    """Every Redis key and channel of this deployment starts with it (deployments or test runs can share one)."""


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """The gateway's API keys (kept hashed by `gateway.auth.Auth`), and the key the CLI's client commands send."""

    api_keys: str | None = None
    api_keys_file: str | None = None
    admin_key: str | None = None
    api_key: str | None = None


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's dashboard and its browser-facing rules (docs/dashboard.md, docs/http-api.md)."""

    cors_origins: tuple[str, ...] = ()
    ui: bool = True
    ui_labs: bool = True
    ui_secret: str | None = None  # unset: each gateway process signs sessions with a random secret of its own
    ui_session_s: int = 8 * 3600


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of a Tenure process, in sections (see the module docstring). Build it with `from_env` (the
    environment, then flags) or `of` (plain values by variable name, for code and tests)."""

    store: StoreSettings = field(default_factory=StoreSettings)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    limits: AdmissionLimits = field(default_factory=AdmissionLimits)
    gate: GateConfig = field(default_factory=GateConfig)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    app: str = DEFAULT_APP
    log_level: str = "info"
    log_format: str = "auto"
    faults: str | None = None
    model_url: str = "http://127.0.0.1:8001/v1"  # the `chat` example's model endpoint
    url: str | None = None  # the gateway the CLI's client commands talk to (unset: the store directly)
    metrics_port: int | None = None
    # Global quotas (docs/quotas.md): TENURE_QUOTAS='llm:gpt-4o=8,llm:mock=8/fail-open', over tenure.toml.
    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `TENURE_*` variables, then apply non-None `overrides` (from CLI flags; named like the variables,
        without the prefix, lower case)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, text in env.items():
            if not key.startswith("TENURE_"):
                continue
            name = key[len("TENURE_") :].lower()
            row = _TABLE.get(name)
            if row is None:
                raise ConfigError(f"unknown setting {key} (see docs/configuration.md for the list)")
            values[name] = row[2](key, text)
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls.of(**values)

    @classmethod
    def of(cls, **values: Any) -> Settings:
        """Settings from typed values named like the variables (`database_url=`, `heartbeat_s=`, ...); the rest
        defaults. An unknown name is an error."""
        return cls().replace(**values)

    def replace(self, **values: Any) -> Settings:
        """A copy with these values changed (named like the variables, e.g. `replace(database_url=url)`)."""
        sections: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for name, value in values.items():
            row = _TABLE.get(name)
            if row is None:
                raise ConfigError(f"unknown setting {name!r} (see docs/configuration.md for the list)")
            section, attr, _ = row
            if section:
                sections.setdefault(section, {})[attr] = value
            else:
                top[attr] = value
            for other, other_attr in _ALSO.get(name, ()):
                sections.setdefault(other, {})[other_attr] = value
        for section, changes in sections.items():
            top[section] = dataclasses.replace(getattr(self, section), **changes)
        return dataclasses.replace(self, **top)


# -- parsers: (variable name, text) -> value ---------------------------------------------------------------------
def _pos_float(name: str, text: str, unit: str = "seconds") -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of {unit}, not {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{name} must be a positive, finite number, not {text!r}")
    return value


def _seconds_or_off(name: str, text: str) -> float | None:
    return None if text.strip() in ("0", "off") else _pos_float(name, text)


def _int_at_least(name: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {text!r}") from None
    if value < least:
        raise ConfigError(f"{name} must be at least {least}, not {value}")
    return value


def _pos_int(name: str, text: str) -> int:
    return _int_at_least(name, text, 1)


def _nonneg_int(name: str, text: str) -> int:
    return _int_at_least(name, text, 0)


def _port(name: str, text: str) -> int | None:
    if not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise ConfigError(f"{name} must be a port number (0 for any free one), not {value}")
    return value


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().upper() if options[0].isupper() else text.strip().lower()
        if value not in options:
            raise ConfigError(f"{name} must be one of {', '.join(options)}, not {text!r}")
        return value

    return parse


def _switch(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"{name} must be on or off, not {text!r}")


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(f"{name} is empty")
    return text.strip()


def _modes(name: str, text: str) -> frozenset[str]:
    out = set()
    for item in (t.strip() for t in text.split(",") if t.strip()):
        agent, sep, mode = item.partition(":")
        if not sep or not agent or not mode:
            raise ConfigError(f"TENURE_{name.upper()}: {item!r} is not AGENT:MODE (e.g. diagnose:deep)")
        out.add(f"{agent}:{mode}")
    return frozenset(out)


def _weights(name: str, text: str) -> tuple[tuple[str, float], ...]:
    out: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        tenant, sep, weight = item.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = 0.0
        if not sep or not tenant.strip() or not 0 < value < float("inf"):
            raise ConfigError(f"TENURE_{name.upper()}: {item!r} is not TENANT=WEIGHT with a positive weight (e.g. acme=2)")
        out[tenant.strip()] = value
    return tuple(sorted(out.items()))


def _optional(name: str, text: str) -> str | None:
    return text.strip() or None


def _origins(name: str, text: str) -> tuple[str, ...]:
    from tenure.gateway.cors import parse_origins

    return parse_origins(text)


def _ui_secret(name: str, text: str) -> str | None:
    value = text.strip() or None
    if value is not None and len(value) < 32:
        raise ConfigError(f"{name} needs at least 32 characters (it signs the dashboard's session cookies)")
    return value


def _session_s(name: str, text: str) -> int:
    from tenure.gateway.ui.sessions import parse_session_s

    return parse_session_s(text)


# Every TENURE_* variable: its section ("" for the top level), its field there, and its parser.
_TABLE: dict[str, tuple[str, str, Callable[[str, str], Any]]] = {
    "database_url": ("store", "database_url", _text),
    "sqlite_synchronous": ("store", "sqlite_synchronous", _choice("FULL", "NORMAL")),
    "pg_command_timeout_s": ("store", "pg_command_timeout_s", _seconds_or_off),
    "artifacts_dir": ("store", "artifacts_dir", _optional),
    "artifacts_url": ("store", "artifacts_url", _optional),
    "heartbeat_s": ("worker", "heartbeat_s", _pos_float),
    "claim_ttl_s": ("worker", "claim_ttl_s", _pos_float),
    "sweep_interval_s": ("worker", "sweep_interval_s", _pos_float),
    "drain_timeout_s": ("worker", "drain_timeout_s", _pos_float),
    "poll_s": ("worker", "poll_s", _pos_float),
    "concurrency": ("worker", "concurrency", _pos_int),
    "capabilities": ("worker", "capabilities", lambda name, text: parse_capabilities(text, name)),
    "features": ("worker", "features", lambda name, text: parse_features(text, name)),
    "claim_mode": ("worker", "claim_mode", _choice("one_step", "two_step")),
    "prices": ("worker", "prices", lambda name, text: parse_prices(text, name)),
    "retention_days": ("worker", "retention_days", lambda name, text: _pos_float(name, text, "days")),
    "tenant_retention_days": ("worker", "tenant_retention_days", lambda name, text: parse_tenant_retention(text, name)),
    "artifact_threshold_bytes": ("worker", "artifact_threshold_bytes", _pos_int),
    "max_result_bytes": ("worker", "max_result_bytes", _pos_int),
    "unhealthy_after": ("worker", "unhealthy_after", _pos_int),
    "unhealthy_cooldown_s": ("worker", "unhealthy_cooldown_s", _pos_float),
    "hard_timeout_floor_s": ("worker", "hard_timeout_floor_s", _pos_float),
    "lag_interval_s": ("worker", "lag_interval_s", _pos_float),
    "stall_threshold_s": ("worker", "stall_threshold_s", _pos_float),
    "degraded_lag_s": ("worker", "degraded_lag_s", _pos_float),
    "degraded_for_s": ("worker", "degraded_for_s", _pos_float),
    "max_input_bytes": ("limits", "max_input_bytes", _pos_int),
    "default_deadline_s": ("limits", "default_deadline_s", _pos_float),
    "disabled_modes": ("limits", "disabled_modes", _modes),
    "tenant_weights": ("limits", "tenant_weights", _weights),
    "tenant_budgets": ("limits", "tenant_budgets", lambda name, text: parse_tenant_budgets(text, name)),
    "allow_unregistered": ("limits", "allow_unregistered", _switch),
    "route_grace_ms": ("limits", "route_grace_ms", _nonneg_int),
    "max_queued": ("gate", "max_queued", _pos_int),
    "max_queued_per_tenant": ("gate", "max_queued_per_tenant", _pos_int),
    "breaker_threshold": ("gate", "breaker_threshold", _pos_int),
    "breaker_window_s": ("gate", "breaker_window_s", _pos_float),
    "breaker_open_s": ("gate", "breaker_open_s", _pos_float),
    "cors_origins": ("gateway", "cors_origins", _origins),
    "ui": ("gateway", "ui", _switch),
    "ui_labs": ("gateway", "ui_labs", _switch),
    "ui_secret": ("gateway", "ui_secret", _ui_secret),
    "ui_session_s": ("gateway", "ui_session_s", _session_s),
    "redis_url": ("redis", "url", _optional),
    "redis_prefix": ("redis", "prefix", _text),
    "api_keys": ("auth", "api_keys", _optional),
    "api_keys_file": ("auth", "api_keys_file", _optional),
    "admin_key": ("auth", "admin_key", _optional),
    "api_key": ("auth", "api_key", _optional),
    "app": ("", "app", _text),
    "log_level": ("", "log_level", _choice("debug", "info", "warning", "error")),
    "log_format": ("", "log_format", _choice("auto", "json", "console")),
    "faults": ("", "faults", _optional),
    "model_url": ("", "model_url", _text),
    "url": ("", "url", _optional),
    "metrics_port": ("", "metrics_port", _port),
    "quotas": ("", "quotas", lambda name, text: parse_quotas(text, name)),
}
# A variable read by more than one section: admission sets the routing grace, the worker looks again for a job
# skipped for another worker's grace when that grace is over (worker/claiming.py).
_ALSO: dict[str, tuple[tuple[str, str], ...]] = {"route_grace_ms": (("worker", "route_grace_ms"),)}
VARIABLES = frozenset(_TABLE)
"""The names of every setting (TENURE_<NAME>), for the docs' check."""


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
