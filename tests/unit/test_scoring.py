"""The routing score (control/scoring.py): the formula, the weights, the prefers bonus, the strict filter, ties and
workers without a record."""

from __future__ import annotations

import asyncio
import json

import pytest

from tenure.contracts.errors import ConfigError
from tenure.contracts.profile import check_route_weights, claim_tags, specs_from_json, specs_json
from tenure.contracts.states import WorkerState
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.scoring import (
    DEFAULT_LIMIT_MS,
    FEATURE_BONUS,
    ROUTE_MARGIN,
    SUCCESS_PRIOR,
    decide,
    expand,
    explain,
    rank,
    score,
    strict_requires,
)
from tenure.kernel.registry import Tenure
from tenure.worker.claiming import RECHECK_MARGIN_S, StoreWakeups


def worker(wid: str, *, in_flight: int = 0, concurrency: int = 4, success: float | None = None,
           latency: float | None = None, features: tuple[str, ...] = (), capabilities: tuple[str, ...] = (),
           state: WorkerState = WorkerState.ACTIVE, agents: tuple[str, ...] = ("a",)) -> WorkerInfo:  # fmt: skip
    return WorkerInfo(wid, "h", 1, concurrency, agents, capabilities, state, in_flight, features=features,
                      success_rate=success, latency_ms=latency)  # fmt: skip


def test_score_is_the_weighted_sum_of_the_three_factors() -> None:
    # 0.4·(1 − 0.25) + 0.4·0.9 + 0.2·(1 − 2000/10000)
    assert score(0.25, 0.9, 2000.0, 0) == pytest.approx(0.4 * 0.75 + 0.4 * 0.9 + 0.2 * 0.8)
    assert score(0.25, 0.9, 2000.0, 0, (1.0, 0.0, 0.0)) == pytest.approx(0.75)
    assert score(0.0, 0.0, 50_000.0, 0, (0.0, 0.0, 1.0)) == 0.0  # latency over the limit counts as the limit
    assert score(0.0, 1.0, 500.0, 0, (0.0, 0.0, 1.0), limit_ms=1000.0) == pytest.approx(0.5)


def test_a_worker_without_a_record_scores_the_prior_and_a_full_latency_factor() -> None:
    assert score(0.0, None, None, 0) == pytest.approx(0.4 + 0.4 * SUCCESS_PRIOR + 0.2)
    (c,) = rank([worker("w")], "a", (), ())[0]
    assert (c.success_rate, c.recorded_success_rate, c.latency_ms, c.latency_factor) == (SUCCESS_PRIOR, None, None, 1.0)


def test_load_counts_in_flight_and_jobs_routed_since_the_snapshot() -> None:
    (c,) = rank([worker("w", in_flight=1, concurrency=4)], "a", (), (), routed={"w": 2})[0]
    assert c.load == pytest.approx(0.75) and c.free
    (c,) = rank([worker("w", in_flight=1, concurrency=4)], "a", (), (), routed={"w": 3})[0]
    assert c.load == 1.0 and not c.free


def test_the_weights_decide_between_a_fast_worker_and_a_reliable_one() -> None:
    fast = worker("fast", success=0.3, latency=100.0)
    reliable = worker("reliable", success=1.0, latency=9000.0)
    assert decide([fast, reliable], "a", ()).preferred == "reliable"  # default weights favour the record
    assert decide([fast, reliable], "a", (), weights=(0.0, 0.1, 0.9)).preferred == "fast"


def test_each_preferred_feature_a_worker_offers_adds_the_bonus() -> None:
    plain = worker("a-plain")
    gpu = worker("b-gpu", features=("gpu", "long"))
    ranked, total, _ = rank([plain, gpu], "a", (), ("gpu", "long", "ssd"))
    assert total == 2
    assert [c.worker_id for c in ranked] == ["b-gpu", "a-plain"]
    assert ranked[0].score - ranked[1].score == pytest.approx(2 * FEATURE_BONUS)
    assert ranked[0].features == ("gpu", "long")


def test_strict_prefers_are_a_hard_filter_through_the_claim_tags() -> None:
    plain = worker("a-plain")
    gpu = worker("b-gpu", features=("gpu",))
    need = strict_requires({"gpu"})
    assert need == {"feature:gpu"}
    assert need <= set(claim_tags(gpu.capabilities, gpu.features))
    d = decide([plain, gpu], "a", need, ("gpu",), strict=True)
    assert [c.worker_id for c in d.candidates] == ["b-gpu"]
    assert (d.preferred, d.reason) == (None, "only_candidate")  # one candidate: nothing to choose


def test_only_live_workers_of_the_agent_with_every_requirement_are_candidates() -> None:
    workers = [
        worker("ok", capabilities=("text/summarize",)),
        worker("other-agent", capabilities=("text/summarize",), agents=("b",)),
        worker("no-cap"),
        *(worker(s.value, capabilities=("text/summarize",), state=s) for s in WorkerState if s is not WorkerState.ACTIVE),
    ]
    assert [c.worker_id for c in rank(workers, "a", ("text/summarize",), ())[0]] == ["ok"]


def test_a_category_offered_whole_makes_a_candidate_as_it_claims() -> None:
    whole = worker("whole", capabilities=("text/*",))
    flat = worker("flat", capabilities=("text",))
    assert [c.worker_id for c in rank([whole, flat], "a", ("text/summarize",), ())[0]] == ["whole"]


def test_ties_go_to_the_smaller_worker_id() -> None:
    d = decide([worker("w2"), worker("w1"), worker("w3")], "a", ())
    assert [c.worker_id for c in d.candidates] == ["w1", "w2", "w3"]
    assert (d.preferred, d.reason) == (None, "near_tie")  # alike: nothing to prefer (ROUTE_MARGIN)
    d = decide([worker("w2", in_flight=1), worker("w1", in_flight=1), worker("w3", in_flight=2)], "a", ())
    assert [c.worker_id for c in d.candidates] == ["w1", "w2", "w3"] and d.reason == "near_tie"


def test_no_preference_without_a_choice_or_without_a_free_slot() -> None:
    assert decide([], "a", ()).reason == "no_candidate"
    full = [worker("w1", in_flight=4), worker("w2", in_flight=4)]
    d = decide(full, "a", ())
    assert (d.preferred, d.reason) == (None, "no_free_slot")
    # The best-scored candidate without a free slot is passed over for one with a free slot.
    d = decide([worker("w1", in_flight=4, success=1.0), worker("w2", in_flight=3, success=0.0)], "a", ())
    assert d.candidates[0].worker_id == "w1" and d.preferred == "w2"


def test_a_decision_records_the_best_candidates_and_counts_them_all() -> None:
    many = [worker(f"w{i:02d}", in_flight=(i % 3) + (1 if i else 0)) for i in range(30)]  # w00 alone is idle
    d = decide(many, "a", (), keep=5)
    assert d.candidates_total == 30 and len(d.candidates) == 5
    assert d.preferred == d.candidates[0].worker_id == "w00"
    full = [*(worker(f"w{i}", in_flight=4) for i in range(8)), worker("w9", in_flight=3, success=0.0)]
    d = decide(full, "a", (), keep=2)  # the only free one is not among those listed: still preferred
    assert d.preferred == "w9" and "w9" not in [c.worker_id for c in d.candidates]
    assert len(decide(many, "a", (), keep=None).candidates) == 30


def test_the_decision_serialises_every_factor_and_explains_itself() -> None:
    d = decide([worker("w1", success=0.7, latency=500.0), worker("w2")], "a", (), weights=(0.5, 0.3, 0.2))
    route = expand(json.loads(d.to_json()), d.preferred)  # as the job row stores it, then as GET shows it
    assert route == d.to_dict()
    assert route["weights"] == [0.5, 0.3, 0.2] and route["limit_ms"] == DEFAULT_LIMIT_MS
    for c in route["candidates"]:
        recomputed = score(c["load"], c["recorded_success_rate"], c["latency_ms"], len(c["features"]), route["weights"])
        assert c["score"] == pytest.approx(recomputed)
    assert explain(route, 10.0, None, None, 9.9).startswith("waiting for preferred worker w2")
    assert explain(route, 10.0, "w2", 9.95, 11.0) == "preferred worker claimed it (w2)"
    assert explain(route, 10.0, "w1", 10.2, 11.0) == "grace ended; claimed by w1 (preferred worker was w2)"
    only = decide([worker("w1")], "a", ()).to_dict()
    assert explain(only, None, "w1", 1.0, 2.0) == "only candidate; claimed by w1"


def test_route_weights_are_validated_and_carried_in_the_agent_specs() -> None:
    app = Tenure()

    @app.agent("a", route_weights=(0.1, 0.2, 0.7), prefers=["gpu"])
    async def a(ctx: object, input: object) -> None: ...

    spec = app.specs()["a"]
    assert spec.route_weights == (0.1, 0.2, 0.7) and spec.prefers == {"gpu"}
    assert specs_from_json(specs_json({"a": spec}), ["a"])["a"] == AgentSpec(
        "a", prefers=frozenset({"gpu"}), route_weights=(0.1, 0.2, 0.7)
    )
    for bad in [(0, 0, 0), (1, 2), (-1, 1, 1), "abc", (float("inf"), 0, 0)]:
        with pytest.raises(ConfigError, match="route_weights"):
            check_route_weights(bad, "a")


class _Wakes:
    """Signals whose `wait_for_jobs` answers at once (a wake-up) the first `wakes` times, then times out."""

    def __init__(self, wakes: int) -> None:
        self.wakes = wakes
        self.timeouts: list[float] = []

    async def wait_for_jobs(self, timeout_s: float) -> None:
        self.timeouts.append(timeout_s)
        if self.wakes > 0:
            self.wakes -= 1
            return
        await asyncio.sleep(timeout_s)


async def test_a_wake_up_whose_claim_found_nothing_is_followed_by_a_claim_after_the_grace_not_a_poll() -> None:
    signals = _Wakes(1)
    wakeups = StoreWakeups(signals, 5.0, asyncio.Event(), recheck_s=0.02)  # type: ignore[arg-type]
    await wakeups.next(1, idle=True)  # woken: the claim that follows finds the job another worker's
    await wakeups.next(1, idle=True)  # so this wait ends once that grace is over, not after the poll
    assert signals.timeouts == [5.0, pytest.approx(0.02 + RECHECK_MARGIN_S)]
    off = _Wakes(1)
    plain = StoreWakeups(off, 0.05, asyncio.Event())  # type: ignore[arg-type]
    await plain.next(1, idle=True)
    await plain.next(1, idle=True)
    assert off.timeouts == [0.05, 0.05]


def test_candidates_that_score_within_the_margin_get_no_preference() -> None:
    # A preference costs a grace whenever its worker cannot start the job at once; between workers that score
    # alike it buys nothing, so the job is left to the first that claims it.
    a, b = worker("a", in_flight=1, concurrency=10), worker("b", in_flight=0, concurrency=10)
    d = decide([a, b], "a", ())
    assert (d.preferred, d.reason) == (None, "near_tie")  # 0.04 apart: one slot of ten at the load weight
    assert decide([worker("a", in_flight=2, concurrency=10), b], "a", ()).preferred == "b"  # 0.08 apart
    busy = worker("c", in_flight=10, concurrency=10)  # no free slot: not the runner-up that makes a tie
    assert decide([worker("a", in_flight=2, concurrency=10), busy], "a", ()).reason == "preferred"
    assert ROUTE_MARGIN == 0.05
