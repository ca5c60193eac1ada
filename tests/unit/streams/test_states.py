"""EV-9: every valid transition and every invalid one."""

from __future__ import annotations

import itertools

import pytest

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.streams.states import (
    ACTIONS,
    DELETABLE,
    TRANSITIONS,
    StreamState,
    check_deletable,
    transition,
)

pytestmark = pytest.mark.unit
S = StreamState

EXPECTED = {
    (S.NOT_STARTED, "start"): S.STARTING, (S.STARTING, "started"): S.RUNNING,
    (S.RUNNING, "pause"): S.PAUSED, (S.STARTING, "pause"): S.PAUSED,
    (S.PAUSED, "resume"): S.STARTING, (S.RUNNING, "drain"): S.DRAINING,
    (S.DRAINING, "drained"): S.PAUSED, (S.STARTING, "fail"): S.FAILED,
    (S.RUNNING, "fail"): S.FAILED, (S.DRAINING, "fail"): S.FAILED,
    (S.FAILED, "retry"): S.STARTING, (S.FAILED, "give_up"): S.FAILED_PERMANENTLY,
    (S.FAILED_PERMANENTLY, "reset"): S.NOT_STARTED,
}
STATE_ACTIONS = [a for a in ACTIONS if a != "delete"]


def test_the_table_is_the_documented_one():
    assert EXPECTED == TRANSITIONS


@pytest.mark.parametrize(("state", "action"), list(EXPECTED))
def test_valid_transitions(state: StreamState, action: str):
    assert transition(state, action) == EXPECTED[(state, action)]


INVALID = [(s, a) for s, a in itertools.product(S, STATE_ACTIONS) if (s, a) not in EXPECTED]


@pytest.mark.parametrize(("state", "action"), INVALID)
def test_invalid_transitions_name_the_current_state(state: StreamState, action: str):
    with pytest.raises(FailedPrecondition) as caught:
        transition(state, action)
    assert state.value in str(caught.value) and action in str(caught.value)


def test_unknown_action_and_delete_rules():
    with pytest.raises(InvalidArgument, match="'explode'"):
        transition(S.RUNNING, "explode")
    for state in S:
        if state in DELETABLE:
            check_deletable(state)
        else:
            with pytest.raises(FailedPrecondition, match=state.value):
                check_deletable(state)
