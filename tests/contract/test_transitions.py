"""The transition table governs (tests/contract/conftest.py): the contract suite's state changes are checked
against it, and an illegal change — one no store would make — fails the check."""

from __future__ import annotations

import pytest

from tenure.contracts.errors import IllegalTransition
from tenure.contracts.states import TRANSITIONS, JobState
from tenure.contracts.store import Store
from tests.contract.conftest import StateChange, StateLog, check_changes
from tests.contract.test_store import W1, claim_one, finish, start_one, submit


async def test_every_state_change_of_a_job_is_logged_and_legal(store: Store, state_log: StateLog) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    assert await store.finish(W1, [finish(claim.fence, execution_id)]) == [job_id]
    changes = [(c.old, c.new) for c in await state_log.changes() if c.job_id == job_id]
    assert changes == [(None, "queued"), ("queued", "running"), ("running", "succeeded")]
    assert check_changes(await state_log.changes()) == 3


async def test_an_illegal_state_change_fails_the_check(store: Store, state_log: StateLog) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    await store.finish(W1, [finish(claim.fence, execution_id)])
    assert JobState.RUNNING not in TRANSITIONS[JobState.SUCCEEDED]
    await state_log.force_state(job_id, "running")  # succeeded -> running, behind the stores' back
    changes = await state_log.changes()
    with pytest.raises(IllegalTransition, match="from succeeded to running"):
        check_changes(changes)
    # The end-of-test check would fail this test the same way; forget the forced change so that it checks
    # the legal rest.
    (forced,) = [c for c in changes if c.job_id == job_id and c.old == "succeeded"]
    await state_log.forget(forced)


def test_a_job_must_be_inserted_queued_and_its_log_must_have_no_gap() -> None:
    with pytest.raises(IllegalTransition, match="inserted running"):
        check_changes([StateChange(1, "j", None, "running")])
    with pytest.raises(AssertionError, match="after it became"):
        check_changes([StateChange(1, "j", None, "queued"), StateChange(2, "j", "running", "succeeded")])
    assert check_changes([StateChange(1, "j", None, "queued"), StateChange(2, "j", "queued", "running")]) == 2
