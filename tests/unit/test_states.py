from __future__ import annotations

import pytest

from tenure.contracts.errors import IllegalTransition
from tenure.contracts.states import FINISH_STATES, TERMINAL, TRANSITIONS, JobState, check_transition


def test_every_state_has_a_row_and_terminal_states_only_requeue() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for state in TERMINAL:
        assert TRANSITIONS[state] <= {JobState.QUEUED}
    assert TRANSITIONS[JobState.SUCCEEDED] == frozenset()


def test_an_illegal_move_raises() -> None:
    check_transition(JobState.QUEUED, JobState.RUNNING)
    with pytest.raises(IllegalTransition, match="from succeeded to running"):
        check_transition(JobState.SUCCEEDED, JobState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(JobState.QUEUED, JobState.SUCCEEDED)  # a job must start before it finishes


def test_finish_states_are_reachable_from_running() -> None:
    assert FINISH_STATES <= TRANSITIONS[JobState.RUNNING]
    assert all(s.terminal for s in FINISH_STATES - {JobState.SCHEDULED})
