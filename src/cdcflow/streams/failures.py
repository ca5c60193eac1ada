"""How the runner tells failures apart.

Permanent ones no retry mends (`is_permanent`): a bad definition or argument, or a state a
human must change. Others the machine causes, not the stream (`environmental`): a
destination's disk is full, or a folder cannot be written. They make the stream FAILED with
a message that says so, and the runner retries it for as long as it takes (never giving
up), every ENVIRONMENT_RETRY_SECONDS at most, so that it recovers by itself once there is
room or the folder is writable again; its first batch after that forgives the retries. An
error may come as an exception or as its text inside a Spark query's failure."""

from __future__ import annotations

import re

from cdcflow.errors import FailedPrecondition, InvalidArgument

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
