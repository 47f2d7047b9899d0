"""What a worker tells the registry about itself beyond being alive (docs/routing.md):

    WorkerRecord   its own record: success rate, an EWMA of its execution durations, hard timeouts in a row.
                   Computed by the worker from its own finishes and written with its heartbeat (no round trip
                   of its own).
    agent specs    the admission defaults of every agent it serves (attempts, timeout, retry safety, requires,
                   priority, default budget), written once at registration, so that a producer that never imported the
                   workers' code admits a job of theirs exactly as the workers' app would.

Capabilities are `category/subcategory` strings (`text/summarize`, `text/*` for a whole category); features
are plain names (`gpu`, `long`). A flat tag of before (`gpu`) is still a valid capability.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tenure.contracts.audit import check_budget
from tenure.contracts.errors import ConfigError
from tenure.contracts.types import AgentSpec

# The capability tags of before (control/models.py TAG_PATTERN), and `category/*` for a whole category.
_CAPABILITY = re.compile(r"[A-Za-z0-9_.:/-]{1,64}|[A-Za-z0-9_.:-]{1,62}/\*")
_FEATURE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's record of its own finishes. `success_rate` and `latency_ms` are None until it finished one."""

    success_rate: float | None = None
    latency_ms: float | None = None
    consecutive_timeouts: int = 0


def parse_capabilities(text: str | Iterable[str], what: str = "--capabilities") -> tuple[str, ...]:
    """`text/summarize,image/ocr,text/*` (or a flat tag) as a sorted tuple, or `ConfigError` naming `what`."""
    return _parse(text, _CAPABILITY, what, "category/subcategory (text/summarize), category/* or a flat tag")


def offers(capabilities: Iterable[str], requires: Iterable[str]) -> bool:
    """Whether a worker offering `capabilities` may run a job that `requires` these: each one offered as written,
    or its category offered whole (`text/*` offers `text/summarize`; a flat tag only as written). The claim
    queries of both stores apply the same rule (backends/*/queries.sql, `claim_jobs`)."""
    caps = set(capabilities)
    return all(r in caps or ("/" in r and r.split("/", 1)[0] + "/*" in caps) for r in requires)


def parse_features(text: str | Iterable[str], what: str = "--features") -> tuple[str, ...]:
    """`gpu,long` as a sorted tuple, or `ConfigError` naming `what`."""
    return _parse(text, _FEATURE, what, "a name of letters, digits and _.:- (gpu, long)")


def _parse(text: str | Iterable[str], pattern: re.Pattern[str], what: str, shape: str) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    out: set[str] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        if not pattern.fullmatch(item):
            raise ConfigError(f"{what}: {item!r} is not {shape}")
        out.add(item)
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class JobRoute:
    """What admission's routing recorded on a job (docs/routing.md) and who claimed its first attempt: the preferred
    worker, the end of its grace, the explanation (JSON text, control/scoring.py), the worker named in the first
    `execution.started` and when (epoch seconds), and the store's clock now."""

    preferred_worker: str | None
    preferred_until: float | None
    route_json: str | None
    claimed_by: str | None
    claimed_at: float | None
    now: float


FEATURE_TAG = "feature:"
"""A strict job's preferred features are folded into its `requires` as `feature:NAME`; a worker claims with its
capabilities and one such tag per feature it offers (`claim_tags`), so the claim query enforces them unchanged."""


def claim_tags(capabilities: Iterable[str], features: Iterable[str]) -> tuple[str, ...]:
    """What a worker claims with: its capabilities and `feature:F` for each feature F it offers (docs/routing.md)."""
    return tuple(sorted(set(capabilities) | {FEATURE_TAG + f for f in features}))


def check_route_weights(weights: Any, what: str) -> tuple[float, float, float]:
    """`route_weights` (load, success rate, latency) as three floats, or `ConfigError`: three finite,
    non-negative numbers, not all 0."""
    try:
        out = tuple(float(w) for w in weights)
    except (TypeError, ValueError):
        raise ConfigError(f"agent {what!r}: route_weights must be three numbers, not {weights!r}") from None
    if isinstance(weights, str | bytes) or len(out) != 3:
        raise ConfigError(f"agent {what!r}: route_weights must be three numbers (load, success rate, latency)")
    if any(not (0 <= w < float("inf")) for w in out) or not any(out):
        raise ConfigError(f"agent {what!r}: route_weights must be non-negative and finite, not all 0, not {weights!r}")
    return (out[0], out[1], out[2])


def specs_json(specs: Mapping[str, AgentSpec]) -> str:
    """The admission defaults of these agents as the registry stores them (JSON text)."""
    return json.dumps(
        {
            name: {
                "max_attempts": s.max_attempts,
                "timeout_s": s.timeout_s,
                "retry_safe": s.retry_safe,
                "requires": sorted(s.requires),
                "priority": s.priority,
            }
            | ({"budget": dict(s.budget)} if s.budget else {})
            | ({"prefers": sorted(s.prefers)} if s.prefers else {})
            | ({"route_weights": list(s.route_weights)} if s.route_weights is not None else {})
            for name, s in sorted(specs.items())
        },
        separators=(",", ":"),
    )


def specs_from_json(text: str | None, agents: Iterable[str]) -> dict[str, AgentSpec]:
    """The agent specs of one registry row: those recorded, and the plain defaults for an agent a worker of
    before (no recorded specs) serves. A malformed entry falls back to the defaults too."""
    try:
        recorded: Any = json.loads(text) if text else {}
    except ValueError:
        recorded = {}
    if not isinstance(recorded, dict):
        recorded = {}
    out: dict[str, AgentSpec] = {}
    for name in agents:
        entry = recorded.get(name)
        out[name] = _spec(name, entry) if isinstance(entry, dict) else AgentSpec(name)
    return out


def _spec(name: str, d: dict[str, Any]) -> AgentSpec:
    try:
        timeout = d.get("timeout_s")
        return AgentSpec(
            name,
            max_attempts=int(d.get("max_attempts", 3)),
            timeout_s=None if timeout is None else float(timeout),
            retry_safe=bool(d.get("retry_safe", False)),
            requires=frozenset(str(t) for t in d.get("requires", ())),
            priority=int(d.get("priority", 0)),
            budget=check_budget(d.get("budget") or {}, f"agent {name!r}"),
            prefers=frozenset(str(t) for t in d.get("prefers", ())),
            route_weights=None if d.get("route_weights") is None else check_route_weights(d["route_weights"], name),
        )
    except (TypeError, ValueError, ConfigError):
        return AgentSpec(name)
