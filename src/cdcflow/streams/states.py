"""Stream states (EV-9) and the explicit transitions between them, as a pure function.

NOT_STARTED --start--> STARTING --started--> RUNNING --pause--> PAUSED --resume--> STARTING
RUNNING --drain--> DRAINING --drained--> PAUSED (what was read is finished, then it stops)
STARTING | RUNNING | DRAINING --fail--> FAILED --retry--> STARTING (the runner, with backoff)
FAILED --give_up--> FAILED_PERMANENTLY --reset--> NOT_STARTED (a human decides)
PAUSED | NOT_STARTED | FAILED | FAILED_PERMANENTLY --delete--> (gone)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from cdcflow.errors import FailedPrecondition, InvalidArgument


class StreamState(StrEnum):
    NOT_STARTED = "NOT_STARTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    PAUSED = "PAUSED"
    FAILED = "FAILED"
    FAILED_PERMANENTLY = "FAILED_PERMANENTLY"


S = StreamState
TRANSITIONS: Final[dict[tuple[StreamState, str], StreamState]] = {
    (S.NOT_STARTED, "start"): S.STARTING,
    (S.STARTING, "started"): S.RUNNING,
    (S.RUNNING, "pause"): S.PAUSED,
    (S.STARTING, "pause"): S.PAUSED,
    (S.PAUSED, "resume"): S.STARTING,
    (S.RUNNING, "drain"): S.DRAINING,
    (S.DRAINING, "drained"): S.PAUSED,
    (S.STARTING, "fail"): S.FAILED,
    (S.RUNNING, "fail"): S.FAILED,
    (S.DRAINING, "fail"): S.FAILED,
    (S.FAILED, "retry"): S.STARTING,
    (S.FAILED, "give_up"): S.FAILED_PERMANENTLY,
    (S.FAILED_PERMANENTLY, "reset"): S.NOT_STARTED,
}
ACTIONS: Final = sorted({action for _, action in TRANSITIONS} | {"delete"})
DELETABLE: Final = frozenset({S.NOT_STARTED, S.PAUSED, S.FAILED, S.FAILED_PERMANENTLY})


def transition(current: StreamState, action: str) -> StreamState:
    """The state after `action`; an action not allowed in `current` is an error naming it."""
    if action not in ACTIONS:
        raise InvalidArgument(f"unknown stream action {action!r}; actions: {', '.join(ACTIONS)}")
    if action == "delete":
        raise InvalidArgument("delete is not a state change; use the catalog's delete")
    target = TRANSITIONS.get((current, action))
    if target is None:
        allowed = sorted(a for (state, a) in TRANSITIONS if state == current)
        raise FailedPrecondition(
            f"cannot {action} a stream in state {current.value}; allowed here: "
            f"{', '.join(allowed) or 'nothing'}"
        )
    return target


def check_deletable(current: StreamState) -> None:
    if current not in DELETABLE:
        raise FailedPrecondition(
            f"cannot delete a stream in state {current.value}; pause or drain it first"
        )
