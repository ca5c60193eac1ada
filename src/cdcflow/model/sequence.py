"""`_CHANGE_SEQUENCE_NUMBER` (AP-4): 1 to 4 sections of 1 to 16 hex digits separated by `/`.

Sections compare as unsigned numbers, left to right; a later section counts only when all
earlier ones are equal, and a number that is a prefix of a longer one sorts first. `sort_key`
is a text with that same order (each section zero-padded to 16 digits), for Arrow and Spark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import total_ordering
from typing import Final

from cdcflow.errors import InvalidArgument
from cdcflow.model.timestamps import to_micros

_SECTION: Final = re.compile(r"[0-9A-Fa-f]{1,16}")
_MAX_SECTION: Final = (1 << 64) - 1
RULE: Final = (
    "a _CHANGE_SEQUENCE_NUMBER is 1 to 4 sections of 1 to 16 hexadecimal digits separated by "
    "'/', from 0/0/0/0 to FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF"
)


@total_ordering
@dataclass(frozen=True, slots=True)
class ChangeSequenceNumber:
    """A parsed sequence number; compare with <, ==, > (AP-4)."""

    sections: tuple[int, ...]

    @staticmethod
    def parse(text: object) -> ChangeSequenceNumber:
        if not isinstance(text, str):
            raise InvalidArgument(f"_CHANGE_SEQUENCE_NUMBER {text!r} is not a STRING; {RULE}")
        parts = text.split("/")
        if not 1 <= len(parts) <= 4 or not all(_SECTION.fullmatch(p) for p in parts):
            raise InvalidArgument(f"_CHANGE_SEQUENCE_NUMBER {text!r} is malformed: {RULE}")
        return ChangeSequenceNumber(tuple(int(p, 16) for p in parts))

    @staticmethod
    def from_ints(*values: int) -> ChangeSequenceNumber:
        if not 1 <= len(values) <= 4 or any(not 0 <= v <= _MAX_SECTION for v in values):
            raise InvalidArgument(
                f"sections {values} must be 1 to 4 integers in 0..2^64-1; {RULE}"
            )
        return ChangeSequenceNumber(tuple(values))

    @staticmethod
    def from_timestamp(when: datetime, *more: int) -> ChangeSequenceNumber:
        """First section: epoch milliseconds (AP-4's example); `more` adds sections."""
        return ChangeSequenceNumber.from_ints(to_micros(when) // 1000, *more)

    @staticmethod
    def from_timestamp_micros(when: datetime, *more: int) -> ChangeSequenceNumber:
        """First section: epoch microseconds, for sources with microsecond commit times."""
        return ChangeSequenceNumber.from_ints(to_micros(when), *more)

    def __str__(self) -> str:
        return "/".join(f"{s:X}" for s in self.sections)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ChangeSequenceNumber):
            return NotImplemented
        return self.sections < other.sections

    @property
    def sort_key(self) -> str:
        """Text whose lexicographic order is the sequence order."""
        return "".join(f"{s:016X}" for s in self.sections)


_TEXT: Final = re.compile(r"[0-9A-Fa-f]{1,16}(?:/[0-9A-Fa-f]{1,16}){0,3}")
"""What `parse` accepts, in one pattern."""


def sort_key_of(text: str | None) -> str:
    """The sort key of a sequence number text; "" (lowest) when there is none. Each
    section padded to 16 digits is the section's number in 16 digits, so a well-formed text
    needs no parsing (a malformed one gets `parse`'s error)."""
    if text is None:
        return ""
    if not isinstance(text, str) or _TEXT.fullmatch(text) is None:
        return ChangeSequenceNumber.parse(text).sort_key
    return "".join(section.rjust(16, "0") for section in text.upper().split("/"))


def sequence_text(*values: int) -> str:
    """`str(ChangeSequenceNumber.from_ints(*values))`, without building the number when the
    values are sections (its error when they are not)."""
    if len(values) == 3:  # commit micros / record sequence / mod index: the fold's case
        first, second, third = values
        if 0 <= first <= _MAX_SECTION and 0 <= second <= _MAX_SECTION and \
                0 <= third <= _MAX_SECTION:
            return f"{first:X}/{second:X}/{third:X}"
    elif 1 <= len(values) <= 4 and all(0 <= v <= _MAX_SECTION for v in values):
        return "/".join(f"{v:X}" for v in values)
    return str(ChangeSequenceNumber.from_ints(*values))
