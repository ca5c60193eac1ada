"""How the runner tells failures apart.

Permanent ones no retry mends (`is_permanent`): a bad definition or argument, or a state a
human must change. Others the machine causes, not the stream (`environmental`): a
destination's disk is full, or a folder cannot be written. They make the stream FAILED with
a message that says so, and the runner retries it for as long as it takes (never giving
up), every ENVIRONMENT_RETRY_SECONDS at most, so that it recovers by itself once there is
room or the folder is writable again; its first batch after that forgives the retries. An
error may come as an exception or as its text inside a Spark query's failure.
`record_failure` records one and fails the stream; `RetryPolicy` retries it later."""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.spark.failure_text import MESSAGE_LIMIT, described
from cdcflow.streams.catalog import Catalog, StreamGone, StreamRecord

ENVIRONMENT_RETRY_SECONDS = 10.0
_CAUSES = {
    28: "the disk is full",
    122: "the disk quota is exceeded",
    30: "the file system is read-only",
    13: "permission is denied",
}
_NAMES = {"No space left on device": 28, "Disk quota exceeded": 122,
          "Read-only file system": 30, "Permission denied": 13}
_ERRNO = re.compile(r"\[Errno (\d+)\] ([^:\]]+?)(?:: '([^']*)')?(?:$|[\n;)\]])")


def environmental(error: BaseException) -> str | None:
    """What the machine is refusing, and where, when `error` is such a failure; else None."""
    if isinstance(error, OSError) and error.errno in _CAUSES:
        return _say(error.errno, error.filename)
    text = str(error)
    for match in _ERRNO.finditer(text):
        if int(match.group(1)) in _CAUSES:
            return _say(int(match.group(1)), match.group(3))
    for name, number in _NAMES.items():
        if name in text:
            return _say(number, None)
    return None


def _say(number: int, where: object) -> str:
    place = f" at {where}" if where else ""
    return (f"{_CAUSES[number]}{place}: the stream waits and retries every "
            f"{ENVIRONMENT_RETRY_SECONDS:.0f} s until it can write again")


PERMANENT_ERRORS = (InvalidArgument, FailedPrecondition)


def is_permanent(error: BaseException) -> bool:
    """No retry mends it: a bad definition or argument, or a state that a human must change
    (also when it comes back from Spark as the text of a Python exception)."""
    if isinstance(error, PERMANENT_ERRORS):
        return True
    text = str(error)
    names = {cls.__name__ for base in PERMANENT_ERRORS for cls in (base, *_subclasses(base))}
    return any(f"cdcflow.errors.{name}:" in text for name in names)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found += [sub, *_subclasses(sub)]
    return found


def record_failure(catalog: Catalog, name: str, object_name: str, error: BaseException) -> bool:
    """Record `error` among the stream's errors and fail the stream, for good if no retry
    mends it; True if the machine caused it (the stream waits for it). A scoped catalog's
    StreamGone (the stream was deleted meanwhile) goes on to the caller."""
    cause = environmental(error)
    catalog.record_error(name, object_name, described(error) if cause is None else
                         f"{cause} ({described(error, MESSAGE_LIMIT - len(cause) - 3)})")
    catalog.update_status(name, waiting_for=cause)
    try:
        catalog.act(name, "fail")
        if is_permanent(error):
            catalog.act(name, "give_up")
    except StreamGone:
        raise
    except Exception:
        traceback.print_exc()
    return cause is not None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A FAILED stream is retried with a doubling backoff, up to `max_retries` in a row; a
    failure the machine caused (a full disk, say) is retried for as long as it lasts."""

    max_retries: int
    backoff_seconds: float
    max_backoff_seconds: float

    def retry_later(self, catalog: Catalog, record: StreamRecord, now: float) -> None:
        """Retry the stream if its backoff has passed at `now`, or give it up."""
        name = record.definition.name
        waiting = bool(catalog.status(name).get("waiting_for"))
        if record.retries >= self.max_retries and not waiting:
            catalog.act(name, "give_up")
            return
        delay = min(self.backoff_seconds * 2 ** record.retries, self.max_backoff_seconds,
                    ENVIRONMENT_RETRY_SECONDS if waiting else self.max_backoff_seconds)
        if now - record.changed >= delay:
            catalog.act(name, "retry")
