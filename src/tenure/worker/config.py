"""How one worker process behaves: `WorkerConfig`. docs/configuration.md lists the matching TENURE_* variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tenure.contracts.audit import Price
from tenure.contracts.errors import ConfigError
from tenure.contracts.json_settings import finite_number, parse_json_object
from tenure.contracts.profile import claim_tags

CLAIM_MODES = ("one_step", "two_step")


def parse_tenant_retention(text: str, name: str = "TENURE_TENANT_RETENTION_DAYS") -> dict[str, float]:
    """`{"acme": 7, "audit-heavy": 365}`: each tenant's retention in days (a positive number), over
    TENURE_RETENTION_DAYS for that tenant (docs/retention.md)."""
    return parse_json_object(text, name, '{"acme": 7, "audit-heavy": 365}', _days)


def _days(value: Any) -> float:
    if not finite_number(value) or value <= 0:
        raise ValueError("needs a positive number of days")
    return float(value)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process behaves. See docs/configuration.md for the matching TENURE_* variables."""

    concurrency: int = 10
    heartbeat_s: float = 5.0
    claim_ttl_s: float = 15.0
    sweep_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    poll_s: float = 1.0
    capabilities: tuple[str, ...] = ()  # `category/subcategory` (text/summarize), `category/*`, or flat tags
    features: tuple[str, ...] = ()  # plain names (gpu, long): shown in the profile (docs/routing.md)
    event_buffer: int = 1000
    blocking_max_in_flight: int = 32
    blocking_max_queued: int = 1000
    blocking_queue_timeout_s: float = 60.0
    retry_base_s: float = 1.0
    retry_cap_s: float = 300.0
    # The writer waits this long before a round trip nobody is waiting on (finishes, unflushed events), so
    # that more of them share its commit. 0 writes at once.
    write_linger_s: float = 0.003
    # Observability (docs/observability.md): the lag sampler, its stall log, and lag-aware liveness.
    lag_interval_s: float = 0.05
    stall_threshold_s: float = 0.25
    degraded_lag_s: float = 0.5
    degraded_for_s: float = 2.0
    # `one_step`: the claim CAS and the start CAS in one round trip and one commit (the default: no claimed but
    # unstarted state to release or recover). `two_step`: claim, then start, in two round trips, as a worker
    # does for agents with a worker quota (a slot is taken per claim) and on a PostgreSQL role without the
    # TEMP privilege; it is also the path whose pre-start window the crash tests and the demo exercise.
    claim_mode: str = "one_step"
    # A stopped handler (ownership lost, cancelled, timed out, drained) gets this long to end before it is
    # abandoned: it keeps its slot until it does end (fail closed), and its execution writes nothing more.
    cancel_grace_s: float = 5.0
    # USD per 1,000 input / output tokens by model (TENURE_PRICES): `ctx.usage(model=...)` adds its cost_usd.
    prices: Mapping[str, Price] = field(default_factory=dict)
    # Retention (TENURE_RETENTION_DAYS): the sweeper duty deletes jobs finished longer ago, with their history, a
    # batch of `retention_batch` per sweep (docs/retention.md).
    retention_days: float = 30.0
    retention_batch: int = 100
    # Per-tenant retention (TENURE_TENANT_RETENTION_DAYS): days by tenant, over `retention_days` for those tenants.
    tenant_retention_days: Mapping[str, float] = field(default_factory=dict)
    # Results and evidence by reference (docs/artifacts.md): JSON text over `artifact_threshold_bytes` goes to the
    # artifact store and the job row holds its reference; a result over `max_result_bytes` fails the job.
    artifact_threshold_bytes: int = 256 * 1024
    max_result_bytes: int = 1024**3
    # Health (worker/health.py, docs/routing.md): this many hard timeouts in a row make the worker `unhealthy`,
    # claiming nothing new for the cool-down; then it is `active` again.
    unhealthy_after: int = 3
    unhealthy_cooldown_s: float = 60.0
    # Timeouts (worker/timeouts.py): the least a hard timeout derived from an agent's p99 may be (it is never past
    # the job's `timeout_s`). 60 s: a burst of quick runs must not make a merely slow one fail.
    hard_timeout_floor_s: float = 60.0
    # Routing (TENURE_ROUTE_GRACE_MS, docs/routing.md): a wake-up whose claim found nothing (the new job may be
    # another worker's for its grace) is followed by one more claim this long after, not a whole poll later.
    route_grace_ms: int = 200

    def __post_init__(self) -> None:
        # The one copy of the rule (settings.py builds this section): a heartbeat that is late once (a busy loop,
        # a slow round trip) must not cost the claims. The tolerance absorbs 3 * 0.1 != 0.3.
        if self.claim_ttl_s < 3 * self.heartbeat_s - 1e-9:
            raise ConfigError(
                f"the claim TTL (TENURE_CLAIM_TTL_S, claim_ttl_s: {self.claim_ttl_s:g}) must be at least 3 heartbeats "
                f"(3 × TENURE_HEARTBEAT_S = {3 * self.heartbeat_s:g}): one late heartbeat must not lose a job"
            )
        if self.claim_mode not in CLAIM_MODES:
            raise ConfigError(f"claim_mode must be one of {', '.join(CLAIM_MODES)}, not {self.claim_mode!r}")

    def retention_s(self) -> tuple[float, dict[str, float]]:
        """The retention in seconds: every tenant's default, and the tenants with their own."""
        return self.retention_days * 86400.0, {t: d * 86400.0 for t, d in self.tenant_retention_days.items()}

    @property
    def claim_tags(self) -> tuple[str, ...]:
        """What the claim matches a job's `requires` against: the capabilities and `feature:F` for each feature
        (a strict job's preferred features, contracts/profile.py)."""
        return claim_tags(self.capabilities, self.features)

    @property
    def worker_ttl_s(self) -> float:
        """A worker silent this long is marked gone in the registry."""
        return self.claim_ttl_s * 2
