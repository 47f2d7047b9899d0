"""The routing score (seed 002 §4.2, docs/routing.md), written once: admission's choice of a preferred worker,
the `route` of `GET /v1/jobs/{id}` and `tenure route` all come from `rank` and `decide` here.

    score = w1·(1 − load) + w2·success_rate + w3·(1 − min(latency_ms / limit_ms, 1)) + FEATURE_BONUS · preferred
            features the worker offers

over the live candidates: workers `active` (not gone, draining, unhealthy, warming or degraded) that serve the
agent and offer every tag of the job's `requires` (a strict job's preferred features are among them as
`feature:NAME`, contracts/profile.py). `load` = (in_flight + jobs this admission door routed to the worker since
its registry snapshot) / concurrency. A worker without a record yet counts `SUCCESS_PRIOR` for its success rate
and 1.0 for its latency factor. `limit_ms` is the agent's `timeout=` in milliseconds, else `DEFAULT_LIMIT_MS`.
Ties go to the smaller worker id, so two doors with one snapshot choose alike.

Pure functions of their arguments: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tenure.contracts.profile import FEATURE_TAG, offers
from tenure.contracts.states import WorkerState
from tenure.contracts.types import WorkerInfo

DEFAULT_WEIGHTS: tuple[float, float, float] = (0.4, 0.4, 0.2)
"""(load, success rate, latency): the weights of an agent without `route_weights`."""
FEATURE_BONUS = 0.1
"""Added to a worker's score for each of the job's preferred features it offers."""
SUCCESS_PRIOR = 1.0
"""The success rate of a worker that has not finished a job yet (its `success_rate` is null)."""
DEFAULT_LIMIT_MS = 10_000.0
"""The latency that scores 0 for an agent without `timeout=`."""
ROUTE_MARGIN = 0.05
"""A preference is set only when the best candidate with a free slot scores at least this much above the next
one with a free slot: a preference costs a grace whenever the preferred worker cannot take the job at once, and
between workers that score alike it buys nothing (any of them is as good), so the job is left to the first that
claims it (`near_tie`). 0.05 is an eighth of the load weight, one slot of eight."""
RECORDED_CANDIDATES = 20
"""The candidates a job's `route` lists, best first (with `candidates_total`): every candidate up to 20 workers;
beyond, the row would hold kilobytes per job (about 200 bytes per candidate) that no reader needs. `tenure route`
lists them all."""


class Candidate(NamedTuple):
    """One live, capable worker and its score, factor by factor (a tuple: one is built per candidate per job)."""

    worker_id: str
    score: float
    load: float
    success_rate: float
    """As scored: the worker's record, or `SUCCESS_PRIOR` when it has none (`recorded_success_rate` null)."""
    recorded_success_rate: float | None
    latency_ms: float | None
    latency_factor: float
    """1 − min(latency_ms / limit_ms, 1); 1.0 without a record."""
    features: tuple[str, ...]
    """The job's preferred features this worker offers (FEATURE_BONUS each)."""
    free: bool
    """It has an estimated free slot (in_flight + routed < concurrency)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the `route` field."""
        return {
            "worker_id": self.worker_id,
            "score": self.score,
            "load": self.load,
            "success_rate": self.success_rate,
            "recorded_success_rate": self.recorded_success_rate,
            "latency_ms": self.latency_ms,
            "latency_factor": self.latency_factor,
            "features": list(self.features),
            "free": self.free,
        }


def score(
    load: float,
    success_rate: float | None,
    latency_ms: float | None,
    features: int,
    weights: Sequence[float] = DEFAULT_WEIGHTS,
    limit_ms: float = DEFAULT_LIMIT_MS,
) -> float:
    """The formula of the module docstring, for one worker."""
    w1, w2, w3 = weights
    rate = SUCCESS_PRIOR if success_rate is None else success_rate
    return w1 * (1.0 - load) + w2 * rate + w3 * latency_factor(latency_ms, limit_ms) + FEATURE_BONUS * features


def latency_factor(latency_ms: float | None, limit_ms: float) -> float:
    """1 − min(latency_ms / limit_ms, 1), or 1.0 for a worker without a record."""
    if latency_ms is None:
        return 1.0
    return 1.0 - min(latency_ms / limit_ms, 1.0) if limit_ms > 0 else 0.0


def limit_ms_of(timeout_s: float | None) -> float:
    """The latency limit of an agent: its `timeout=` in milliseconds, else `DEFAULT_LIMIT_MS`."""
    return DEFAULT_LIMIT_MS if timeout_s is None else timeout_s * 1000.0


def _offers(w: WorkerInfo, caps: Sequence[str], features: Sequence[str]) -> bool:
    """Whether `w` claims a job requiring `caps` (matched as the claim does, `text/*` offering `text/summarize`:
    contracts/profile.py `offers`) and, as `feature:F` tags, `features` (contracts/profile.py `claim_tags`)."""
    return offers(w.capabilities, caps) and all(f in w.features or FEATURE_TAG + f in w.capabilities for f in features)


def rank(
    workers: Iterable[WorkerInfo],
    agent: str,
    requires: Iterable[str],
    prefers: Iterable[str],
    weights: Sequence[float] = DEFAULT_WEIGHTS,
    limit_ms: float = DEFAULT_LIMIT_MS,
    routed: Mapping[str, int] | None = None,
    keep: int | None = None,
) -> tuple[list[Candidate], int, str | None]:
    """The live candidates for a job, best first (ties: the smaller worker id): the first `keep` of them (None:
    all), how many there are, and the best one with an estimated free slot. `requires` is the job's whole
    requirement, a strict job's `feature:NAME` tags included; `routed`: jobs routed to each worker since the
    snapshot `workers` was read. Each is scored as plain numbers; only the candidates kept become `Candidate`s
    (at 1,000 workers, building and serialising every one cost more than the choice itself)."""
    need = tuple(requires)
    caps = [t for t in need if not t.startswith(FEATURE_TAG)]
    features = [t[len(FEATURE_TAG) :] for t in need if t.startswith(FEATURE_TAG)]
    wanted = sorted(set(prefers))
    routed = routed or {}
    active = WorkerState.ACTIVE  # (an enum member looked up once, not once per worker)
    scored = []
    for w in workers:
        if w.state is not active or agent not in w.agents or (need and not _offers(w, caps, features)):
            continue
        busy = w.in_flight + routed.get(w.id, 0)
        load = min(busy / w.concurrency, 1.0) if w.concurrency > 0 else 1.0
        offered = tuple(f for f in wanted if f in w.features) if wanted else ()
        total = score(load, w.success_rate, w.latency_ms, len(offered), weights, limit_ms)
        scored.append((-total, w.id, load, busy < w.concurrency, w, offered))
    scored.sort()  # by score, then worker id (ids are unique: the tuples never compare further)
    best_free = next((t[1] for t in scored if t[3]), None)
    out = [
        Candidate(
            wid,
            -neg,
            load,
            SUCCESS_PRIOR if w.success_rate is None else w.success_rate,
            w.success_rate,
            w.latency_ms,
            latency_factor(w.latency_ms, limit_ms),
            offered,
            free,
        )
        for neg, wid, load, free, w, offered in (scored if keep is None else scored[:keep])
    ]
    return out, len(scored), best_free


@dataclass(frozen=True, slots=True)
class Decision:
    """Admission's choice for one job: the preferred worker (None: no preference) and why."""

    preferred: str | None
    reason: str
    """`preferred` (the best of several candidates with a free slot), `local` (the admitting gateway's inline
    worker had room: the local fast path, control/routing.LocalPath; no candidates scored), `only_candidate` (one
    candidate: nothing to choose, no preference set), `no_free_slot` (no candidate had an estimated free slot),
    `no_candidate`, `near_tie` (the two best candidates with a free slot scored within `ROUTE_MARGIN`: either is as
    good, so no preference is set and the first to claim takes it)."""
    candidates: tuple[Candidate, ...]
    weights: tuple[float, float, float]
    limit_ms: float
    prefers: tuple[str, ...]
    strict: bool
    candidates_total: int = 0
    """How many candidates there were (`candidates` lists the best of them; see RECORDED_CANDIDATES)."""

    def to_dict(self) -> dict[str, Any]:
        """The explanation as the job row stores it (and `tenure route` prints it)."""
        return {
            "candidates_total": self.candidates_total,
            "preferred_worker": self.preferred,
            "reason": self.reason,
            "weights": list(self.weights),
            "limit_ms": self.limit_ms,
            "feature_bonus": FEATURE_BONUS,
            "success_prior": SUCCESS_PRIOR,
            "prefers": list(self.prefers),
            "strict": self.strict,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def to_json(self) -> str:
        """The explanation as the job row stores it: compact JSON, each candidate one array of the factors
        `expand` cannot derive (worker id, score, load, recorded success rate, latency, features, free), so that
        admission pays for little more than the choice. `expand` gives back `to_dict`'s form."""
        return json.dumps(
            {
                "reason": self.reason,
                "weights": self.weights,
                "limit_ms": self.limit_ms,
                "prefers": self.prefers,
                "strict": self.strict,
                "total": self.candidates_total,
                "c": [(c[0], c[1], c[2], c[4], c[5], c[7], c[8]) for c in self.candidates],
            },
            separators=(",", ":"),
        )


def expand(stored: Mapping[str, Any], preferred: str | None) -> dict[str, Any]:
    """A stored explanation (`Decision.to_json`) in `Decision.to_dict`'s form, with the preferred worker of the
    job's row."""
    limit_ms = float(stored["limit_ms"])
    candidates = [
        Candidate(
            wid,
            score_,
            load,
            SUCCESS_PRIOR if rate is None else rate,
            rate,
            latency,
            latency_factor(latency, limit_ms),
            tuple(features),
            free,
        ).to_dict()
        for wid, score_, load, rate, latency, features, free in stored["c"]
    ]
    return {
        "candidates_total": stored["total"],
        "preferred_worker": preferred,
        "reason": stored["reason"],
        "weights": list(stored["weights"]),
        "limit_ms": limit_ms,
        "feature_bonus": FEATURE_BONUS,
        "success_prior": SUCCESS_PRIOR,
        "prefers": list(stored["prefers"]),
        "strict": stored["strict"],
        "candidates": candidates,
    }


def decide(
    workers: Iterable[WorkerInfo],
    agent: str,
    requires: Iterable[str],
    prefers: Iterable[str] = (),
    strict: bool = False,
    weights: Sequence[float] | None = None,
    limit_ms: float = DEFAULT_LIMIT_MS,
    routed: Mapping[str, int] | None = None,
    keep: int | None = RECORDED_CANDIDATES,
) -> Decision:
    """Rank the candidates and choose: the best one with an estimated free slot when there are several. The
    decision lists the best `keep` candidates (None: every one; `tenure route` shows them all)."""
    w = DEFAULT_WEIGHTS if weights is None else (float(weights[0]), float(weights[1]), float(weights[2]))
    ranked, total, best_free = rank(workers, agent, requires, prefers, w, limit_ms, routed, keep)
    if total == 0:
        preferred, reason = None, "no_candidate"
    elif total == 1:
        preferred, reason = None, "only_candidate"
    elif best_free is None:
        preferred, reason = None, "no_free_slot"
    elif _near_tie(ranked):
        preferred, reason = None, "near_tie"
    else:
        preferred, reason = best_free, "preferred"
    return Decision(preferred, reason, tuple(ranked), w, limit_ms, tuple(sorted(set(prefers))), strict, total)


def _near_tie(ranked: Sequence[Candidate]) -> bool:
    """Whether the two best candidates with a free slot score within `ROUTE_MARGIN` of each other."""
    free = [c.score for c in ranked if c.free][:2]
    return len(free) == 2 and free[0] - free[1] < ROUTE_MARGIN


def strict_requires(prefers: Iterable[str]) -> frozenset[str]:
    """The tags a strict job adds to its `requires`: `feature:NAME` for each preferred feature."""
    return frozenset(FEATURE_TAG + f for f in prefers)


def explain(
    route: Mapping[str, Any],
    preferred_until: float | None,
    claimed_by: str | None,
    claimed_at: float | None,
    now: float,
) -> str:
    """Why the job went where it went, from its stored route and who claimed it (first attempt) when: computed
    at read time, never stored."""
    preferred = route.get("preferred_worker")
    reason = route.get("reason")
    if claimed_by is None:
        if preferred is not None and preferred_until is not None and now < preferred_until:
            return f"waiting for preferred worker {preferred} (grace ends in {max(preferred_until - now, 0):.3f} s)"
        if preferred is not None:
            return f"grace for preferred worker {preferred} ended; not claimed yet (any capable worker may claim it)"
        return {
            "near_tie": "the best candidates scored alike (no preference); not claimed yet",
            "only_candidate": "only candidate; not claimed yet",
            "no_free_slot": "no candidate had a free slot; not claimed yet (any capable worker may claim it)",
            "no_candidate": "no live candidate when admitted; not claimed yet",
        }.get(str(reason), "not claimed yet")
    if preferred is not None:
        if claimed_by == preferred and reason == "local":
            return f"local fast path: the admitting gateway's inline worker claimed it ({preferred})"
        if claimed_by == preferred:
            return f"preferred worker claimed it ({preferred})"
        if preferred_until is not None and claimed_at is not None and claimed_at >= preferred_until:
            return f"grace ended; claimed by {claimed_by} (preferred worker was {preferred})"
        return f"claimed by {claimed_by} (preferred worker was {preferred})"
    if reason == "only_candidate":
        return f"only candidate; claimed by {claimed_by}"
    if reason == "near_tie":
        return f"the best candidates scored alike (no preference); claimed by {claimed_by}"
    if reason == "no_free_slot":
        return f"no candidate had a free slot; claimed by {claimed_by}"
    if reason == "no_candidate":
        return f"no live candidate when admitted; claimed by {claimed_by}"
    return f"claimed by {claimed_by}"
