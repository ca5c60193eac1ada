"""The capture hot paths give exactly what the plain paths give (CS-5, CS-7, EV-6).

Batching (`append_many`), changes kept in memory (`source_records(in_memory=True)`), the
hand-built record body (`encode_record`), records encoded without being built
(`encoded_source_records`), the cheap value tests (`quick_check`), PostgreSQL's timestamp
text rewritten rather than parsed, and the
identity caches exist for speed only: each must agree with the path it shortcuts, on inputs
hypothesis makes up.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow import FakeClock, PartitionPolicy
from cdcflow.capture.postgres import types as pg_types
from cdcflow.errors import CdcflowError, InvalidArgument
from cdcflow.events import files as files_module
from cdcflow.model import events as events_module
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.events import change_uuid
from cdcflow.model.memo import IdentityMemo
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.schema import ChangeStreamDef
from cdcflow.model.source import SourceMetadata
from cdcflow.model.timestamps import _format_utc, to_micros
from cdcflow.model.types import ColumnType, decode_value, quick_check, validate_value
from cdcflow.store import record_types
from cdcflow.store.capture import PartitionRanges, encode_record
from cdcflow.store.changelog import ChangeLog
from cdcflow.store.log import LOG_DATA, DataRow
from cdcflow.store.source_records import encoded_source_records, source_records

pytestmark = pytest.mark.property

ACCOUNTS = (
    ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
    ColumnTypeInfo("owner", ColumnType("STRING", length=8), False, 2),
    ColumnTypeInfo("balance", ColumnType("INT64"), False, 3),
)
HISTORY = (  # no primary key
    ColumnTypeInfo("tid", ColumnType("INT64"), False, 1),
    ColumnTypeInfo("note", ColumnType("STRING"), False, 2),
)
START = datetime(2026, 3, 1, tzinfo=UTC)


@st.composite
def changes(draw: Any) -> SourceChange:
    lsn = f"0/{draw(st.integers(1, 2**32 - 1)):X}"
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["INSERT", "UPDATE", "DELETE"]))
        values = {"owner": draw(st.none() | st.text(max_size=8)),
                  "balance": draw(st.none() | st.integers(-(2**63), 2**63 - 1))}
        new = {} if kind == "DELETE" else values
        old = values if kind == "DELETE" and draw(st.booleans()) else {}
        capture = "NEW_ROW_AND_OLD_VALUES" if old else "NEW_ROW"
        return SourceChange("public.accounts", kind, {"id": draw(st.integers(0, 20))}, new,
                            old, ACCOUNTS, capture, {"lsn": lsn})
    row = {"tid": draw(st.integers(0, 5)), "note": draw(st.text(max_size=5))}
    return SourceChange("public.history", "INSERT", {}, row, {}, HISTORY, "NEW_ROW",
                        {"lsn": lsn})


@st.composite
def transactions(draw: Any) -> list[SourceTransaction]:
    batch = []
    for number in range(draw(st.integers(1, 6))):
        metadata = SourceMetadata("postgres-cdc-wal",
                                  START + timedelta(seconds=draw(st.integers(0, 99))),
                                  str(number), {"commit_lsn": f"1/{number:X}"})
        batch.append(SourceTransaction(metadata, tuple(draw(st.lists(changes(), min_size=1,
                                                                      max_size=12)))))
    return batch


def log_rows(path: str) -> list[tuple[Any, ...]]:
    """The data records, each partition named by its key range (tokens are random)."""
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute(
            "SELECT l.stream, p.range_start, l.commit_micros, l.seq, l.mods, l.body "
            "FROM _log AS l JOIN _partitions AS p ON p.stream = l.stream AND p.token = l.token "
            "WHERE l.kind = ?", (LOG_DATA,)).fetchall())


def open_log(path: Path) -> ChangeLog:
    log = ChangeLog.open(path, clock=FakeClock(START), initial_partitions=3,
                         partition_policy=PartitionPolicy(auto=False))
    log.ensure_change_stream("changes")
    log.ensure_change_stream("more")
    return log


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=transactions())
def test_append_many_writes_what_appending_one_by_one_writes(batch: list[SourceTransaction]):
    """One batch (one pass, changes in memory) and one `append` per transaction (the
    streaming path, changes read twice) put the same rows into the log, byte for byte."""
    with tempfile.TemporaryDirectory() as folder:
        batched, single = open_log(Path(folder, "a.db")), open_log(Path(folder, "b.db"))
        batched.append_many("pg", batch, None, {"end_lsn": "9/0"})
        after = None
        for number, transaction in enumerate(batch):
            position = {"end_lsn": f"8/{number}"}
            single.append("pg", transaction, after, position)
            after = position
        assert log_rows(batched.path) == log_rows(single.path)
        assert len(log_rows(batched.path)) >= 2 * len(batch)  # both streams, each transaction


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=transactions(), tokens=st.integers(1, 4))
def test_records_in_memory_equal_records_streamed_and_bodies_equal_to_dict(
        batch: list[SourceTransaction], tokens: int):
    space = 2**62
    ranges = PartitionRanges(tuple(space * i // tokens for i in range(tokens)),
                             tuple(f"t{i}" for i in range(tokens)))
    streams = [ChangeStreamDef("all", True, (), 10**12, "NEW_ROW", 0),
               ChangeStreamDef("accounts", False, (("public.accounts", None),), 10**12,
                               "NEW_ROW", 0)]
    for transaction in batch:
        def made(in_memory: bool, t: SourceTransaction = transaction) -> list[Any]:
            return list(source_records(t.metadata, lambda: t.changes, streams,
                                       lambda _: ranges, START, "7", in_memory=in_memory))

        kept, streamed = made(True), made(False)
        key = lambda e: (e.stream, e.sequence)  # noqa: E731
        assert sorted(kept, key=key) == sorted(streamed, key=key)
        for entry in kept:
            assert json.loads(encode_record(entry.record)) == \
                json.loads(json.dumps(entry.record.to_dict()))
        encoded = list(encoded_source_records(transaction.metadata, lambda t=transaction:
                                              t.changes, streams, lambda _: ranges,
                                              to_micros(START), "7"))
        assert encoded == [DataRow(e.stream, e.token, to_micros(START), e.sequence,
                                   len(e.record.mods), *_apart(encode_record(e.record)))
                           for e in kept]


def _apart(body: str) -> tuple[str, str | None]:
    """A whole body as `_log` keeps it: the rest of it, and its column types apart."""
    types, rest = record_types.split(body)
    assert types is not None
    return rest, types


VALUE_TYPES = [ColumnType("INT64"), ColumnType("STRING", length=3), ColumnType("STRING"),
               ColumnType("BOOL"), ColumnType("FLOAT64"), ColumnType("DATE"),
               ColumnType("NUMERIC", precision=5, scale=2), ColumnType("TIMESTAMP")]
TIMESTAMP_LIKE = (
    st.datetimes().map(lambda d: d.isoformat(timespec="microseconds") + "Z")
    | st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()[:26] + "Z")
    | st.text(alphabet="0123456789-:.TWZ+ ", min_size=27, max_size=27)
    | st.tuples(st.datetimes(), st.integers(0, 26), st.characters()).map(
        lambda t: (lambda s: s[:t[1]] + t[2] + s[t[1] + 1:])(
            t[0].isoformat(timespec="microseconds") + "Z")))
"""Texts of the record encoding's shape: right, off by a character, or with an offset."""
ANY_VALUE = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
             | st.text(max_size=6) | st.lists(st.integers(), max_size=2) | TIMESTAMP_LIKE)


@settings(max_examples=400, deadline=None)
@given(ctype=st.sampled_from(VALUE_TYPES), value=ANY_VALUE)
def test_a_value_the_quick_check_passes_passes_the_full_check(ctype: ColumnType, value: Any):
    if not quick_check(ctype)(value):
        return  # "ask the full check": nothing claimed
    validate_value(decode_value(value, ctype), ctype, "c")


def test_the_quick_check_is_not_always_false():
    """The property above means something only if the quick check says yes at times."""
    assert quick_check(ColumnType("INT64"))(5) and quick_check(ColumnType("STRING"))("x")
    assert not quick_check(ColumnType("INT64"))(2**63)
    assert not quick_check(ColumnType("INT64"))(True)
    assert not quick_check(ColumnType("STRING", length=2))("abc")
    timestamp = quick_check(ColumnType("TIMESTAMP"))
    assert timestamp("2026-11-28T18:02:08.398974Z") and timestamp(None)
    assert not timestamp("2026-11-28T18:02:08.398+01Z")  # an offset: the full check says
    assert not timestamp("2026-13-28T18:02:08.398974Z")
    with pytest.raises(InvalidArgument):
        validate_value(decode_value("abc", ColumnType("STRING", length=2)),
                       ColumnType("STRING", length=2), "c")


def test_an_identity_memo_computes_once_per_object_and_never_confuses_equal_ones():
    calls: list[tuple[int, ...]] = []

    def compute(key: tuple[int, ...]) -> int:
        calls.append(key)
        return sum(key)

    memo: IdentityMemo[tuple[int, ...], int] = IdentityMemo(compute, size=2)
    first = tuple(range(3))
    assert memo(first) == 3 and memo(first) == 3 and len(calls) == 1
    equal = tuple(range(3))
    assert equal is not first and memo(equal) == 3 and len(calls) == 2
    for n in range(5):  # past its size it forgets, and still answers right
        assert memo(tuple(range(n))) == sum(range(n))
    assert memo(first) == 3


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20), st.lists(st.text(max_size=12) | st.integers(), max_size=5))
def test_an_event_uuid_is_the_standard_uuid5_of_its_position(stream: str, position: list):
    """EV-8: the uuid, built from the digest by hand, is exactly RFC 4122's version 5."""
    name = "/".join([stream, *map(str, position)])
    assert change_uuid(stream, *position) == str(uuid.uuid5(events_module._NAMESPACE, name))


@settings(max_examples=300, deadline=None)
@given(st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                                                timezone(timedelta(hours=-8))])))
def test_remembered_timestamp_texts_equal_fresh_ones(when: datetime):
    """Event times and folders are formatted once per distinct time (lru_cache), and their
    minutes once per minute: the texts are those of formatting anew, in any zone."""
    fresh = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{when.microsecond // 1000:03d}Z"
    assert events_module._millis_text(when) == fresh
    assert files_module._minute_folder(when) == when.strftime("%Y/%m/%d/%H/%M")


def test_one_instant_in_two_zones_is_two_minute_folders():
    """The folder is the minute in the time's own zone, also when the same instant was
    formatted before in another zone (equal datetimes, one remembered text each)."""
    utc = datetime(2026, 11, 27, 10, 0, 30, tzinfo=UTC)
    india = utc.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert files_module._minute_folder(utc) == "2026/11/27/10/00"
    assert files_module._minute_folder(india) == "2026/11/27/15/30"
    assert events_module._millis_text(india) == events_module._millis_text(utc) == \
        "2026-11-27T10:00:30.000Z"


PAYLOAD_TYPES = [ColumnType("INT64"), ColumnType("STRING"), ColumnType("BOOL"),
                 ColumnType("FLOAT64"), ColumnType("BYTES"), ColumnType("NUMERIC")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PAYLOAD_TYPES), ANY_VALUE), min_size=1, max_size=6))
def test_event_payload_encoders_equal_the_plain_json_value(columns):
    """EV-2: the per-column encoders of an event's payload give `_json_value`'s answer."""
    types = tuple(ColumnTypeInfo(f"c{i}", ctype, False, i + 1)
                  for i, (ctype, _) in enumerate(columns))
    for (name, encode), column, (ctype, value) in zip(
            events_module._payload_encoders(types), types, columns, strict=True):
        try:
            python_value = decode_value(value, ctype)
            expected = events_module._json_value(python_value, column)
        except (CdcflowError, TypeError, ValueError, ArithmeticError):
            continue  # not a value of this type: nothing to encode
        assert name == column.name and repr(encode(python_value)) == repr(expected)  # NaN


@settings(max_examples=400, deadline=None)
@given(st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5)),
                                                timezone(timedelta(minutes=-90))])))
def test_rfc3339_texts_of_utc_values_equal_converted_ones(when: datetime):
    """CS-7's timestamp text: a value already in `datetime.UTC` takes a shortcut (no
    conversion); every value, of any zone, still gets the text of converting it to UTC."""
    try:
        converted = when.astimezone(UTC)
    except OverflowError:
        return  # an offset pushes it past year 1 or 9999: not a timestamp
    expected = converted.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
    assert _format_utc.__wrapped__(when) == expected
    assert _format_utc.__wrapped__(converted) == expected


def _pg_text(moment: datetime, zone: bool) -> str:
    """A timestamp as PostgreSQL prints it in UTC with DateStyle ISO: trailing zeros of the
    second cut, no fraction for a whole second, `+00` for a timestamptz."""
    text = moment.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + ("+00" if zone else "")


@settings(max_examples=400, deadline=None)
@given(st.datetimes(), st.booleans())
def test_postgres_timestamp_text_in_utc_is_rewritten_as_parsing_gives(moment: datetime,
                                                                       zone: bool):
    text = _pg_text(moment, zone)
    expected = _format_utc(pg_types._parse_timestamp(text).astimezone(UTC))
    assert pg_types._timestamp(text) == expected
    assert quick_check(ColumnType("TIMESTAMP"))(expected)


def test_other_postgres_timestamp_texts_are_parsed_or_refused():
    assert pg_types._timestamp("2026-11-28 18:02:08.5+05:30") == "2026-11-28T12:32:08.500000Z"
    assert pg_types._timestamp("0099-01-02 03:04:05") == "0099-01-02T03:04:05.000000Z"
    for text in ("2026-11-28 18:02:08 BC", "infinity", "10000-01-01 00:00:00"):
        with pytest.raises(InvalidArgument):
            pg_types._timestamp(text)
