"""A decoder of PostgreSQL's `pgoutput` logical replication messages (protocol version 1,
with logical decoding messages). Pure: bytes in, frozen values out.

The formats are PostgreSQL's "Logical Replication Message Formats": Begin, Commit, Origin,
Relation, Type, Insert, Update, Delete, Truncate and Message. Column values arrive as text
(the types' output functions), as NULL, or as "unchanged TOAST" (`UNCHANGED`): a large value
an UPDATE did not touch, which the server does not send again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cdcflow.errors import InvalidArgument

PG_EPOCH_MICROS: Final = 946_684_800 * 1_000_000
"""Microseconds from the Unix epoch to PostgreSQL's (2000-01-01)."""


class Unchanged:
    """An unchanged TOASTed value (the 'u' kind): not sent, not written by the UPDATE."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged()
Value = str | None | Unchanged


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_micros: int
    """Unix epoch microseconds."""
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_micros: int


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    is_key: bool
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:
    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    """'d' default (primary key), 'n' nothing, 'f' full, 'i' index."""
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relation_id: int
    old_kind: str | None
    """'K' (the old key), 'O' (the old row, REPLICA IDENTITY FULL) or None."""
    old: tuple[Value, ...] | None
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation_id: int
    old_kind: str
    old: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgMessage = Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | \
    Truncate | Message


class _Reader:
    """A cursor over one message's bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> int:
        layout = _LAYOUTS[fmt]
        end = self.at + layout.size
        if end > len(self.data):
            raise self._early()
        value: int = layout.unpack_from(self.data, self.at)[0]
        self.at = end
        return value

    def _early(self) -> InvalidArgument:
        return InvalidArgument(f"pgoutput message {self.data[:1]!r} ends early at byte "
                               f"{self.at} of {len(self.data)}")

    def row_head(self) -> tuple[int, str]:
        """The relation id and the first part letter of an Insert, Update or Delete."""
        end = self.at + 5
        if end > len(self.data):
            raise self._early()
        relation_id, part = _ROW_HEAD.unpack_from(self.data, self.at)
        self.at = end
        return relation_id, chr(part)

    def byte(self) -> str:
        at = self.at
        if at >= len(self.data):
            raise self._early()
        self.at = at + 1
        return chr(self.data[at])

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise InvalidArgument(f"pgoutput message {self.data[:1]!r} has an unterminated "
                                  f"string at byte {self.at}")
        text = self.data[self.at:end].decode("utf-8")
        self.at = end + 1
        return text

    def raw(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise InvalidArgument(f"pgoutput message {self.data[:1]!r} ends early")
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def tuple_data(self) -> tuple[Value, ...]:
        """A TupleData part; the hot loop of decoding, so it reads the bytes itself."""
        data, size = self.data, len(self.data)
        values: list[Value] = []
        for _ in range(self.take("!H")):
            at = self.at
            if at >= size:
                raise self._early()
            kind = data[at]
            if kind == _TEXT:
                if at + 5 > size:
                    raise self._early()
                (length,) = _INT32.unpack_from(data, at + 1)
                start = at + 5
                if length < 0 or start + length > size:
                    raise self._early()
                values.append(data[start:start + length].decode("utf-8"))
                self.at = start + length
                continue
            if kind == _NULL:
                values.append(None)
            elif kind == _UNCHANGED_TOAST:
                values.append(UNCHANGED)
            else:
                raise InvalidArgument(f"tuple column kind {chr(kind)!r} is not n, u or t (text "
                                      "format; cdcflow does not ask for binary)")
            self.at = at + 1
        return tuple(values)


_LAYOUTS: Final = {fmt: struct.Struct(fmt) for fmt in ("!B", "!H", "!I", "!i", "!Q", "!q")}
_INT32: Final = _LAYOUTS["!i"]
_ROW_HEAD: Final = struct.Struct("!IB")
_TEXT, _NULL, _UNCHANGED_TOAST = ord("t"), ord("n"), ord("u")


def _begin(r: _Reader) -> Begin:
    return Begin(r.take("!Q"), r.take("!q") + PG_EPOCH_MICROS, r.take("!I"))


def _commit(r: _Reader) -> Commit:
    return Commit(r.take("!B"), r.take("!Q"), r.take("!Q"), r.take("!q") + PG_EPOCH_MICROS)


def _relation(r: _Reader) -> Relation:
    relation_id, namespace, name, identity = r.take("!I"), r.string(), r.string(), r.byte()
    columns = tuple(RelationColumn(bool(r.take("!B") & 1), r.string(), r.take("!I"),
                                   r.take("!i")) for _ in range(r.take("!H")))
    return Relation(relation_id, namespace, name, identity, columns)


def _update(r: _Reader) -> Update:
    relation_id, kind = r.row_head()
    old_kind, old = None, None
    if kind in ("K", "O"):
        old_kind, old = kind, r.tuple_data()
        kind = r.byte()
    if kind != "N":
        raise InvalidArgument(f"update message part {kind!r} is not K, O or N")
    return Update(relation_id, old_kind, old, r.tuple_data())


def _insert(r: _Reader) -> Insert:
    relation_id, part = r.row_head()
    if part != "N":
        raise InvalidArgument(f"insert message part {part!r} is not N")
    return Insert(relation_id, r.tuple_data())


def _delete(r: _Reader) -> Delete:
    relation_id, kind = r.row_head()
    if kind not in ("K", "O"):
        raise InvalidArgument(f"delete message part {kind!r} is not K or O")
    return Delete(relation_id, kind, r.tuple_data())


def _truncate(r: _Reader) -> Truncate:
    count, options = r.take("!I"), r.take("!B")
    return Truncate(tuple(r.take("!I") for _ in range(count)), bool(options & 1),
                    bool(options & 2))


def _message(r: _Reader) -> Message:
    flags, lsn, prefix = r.take("!B"), r.take("!Q"), r.string()
    return Message(bool(flags & 1), lsn, prefix, r.raw(r.take("!I")))


_DECODERS: dict[str, Callable[[_Reader], PgMessage]] = {
    "B": _begin, "C": _commit, "R": _relation, "I": _insert, "U": _update, "D": _delete,
    "T": _truncate, "M": _message,
    "O": lambda r: Origin(r.take("!Q"), r.string()),
    "Y": lambda r: TypeInfo(r.take("!I"), r.string(), r.string()),
}


def decode(payload: bytes) -> PgMessage:
    """One pgoutput message; an unknown or malformed one is InvalidArgument."""
    if not payload:
        raise InvalidArgument("an empty pgoutput message")
    reader = _Reader(payload)
    kind = reader.byte()
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise InvalidArgument(f"pgoutput message kind {kind!r} is not one of "
                              f"{''.join(sorted(_DECODERS))} (protocol version 1)")
    message: PgMessage = decoder(reader)
    return message


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it: two hex halves, `16/B374D848`."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
