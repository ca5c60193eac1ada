"""The batch pipeline's hot paths give exactly what the plain paths give (AP-4, EV-2, EV-4).

`batch_dicts` (a record batch's rows, timestamps made once per value), `sort_key_of` and
`sequence_text` (sequence numbers without parsing or building them), the schema keys found by
identity, the mods' JSON read with orjson and the events' source metadata laid over a template
exist for speed only: each must agree with the path it shortcuts, on inputs hypothesis makes
up.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cdcflow.errors import InvalidArgument
from cdcflow.model import events as events_module
from cdcflow.model.events import Change, change_type, schema_key, source_fields
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.sequence import ChangeSequenceNumber, sequence_text, sort_key_of
from cdcflow.model.source import KINDS, SourceKind, SourceMetadata, object_parts
from cdcflow.model.types import ColumnType
from cdcflow.spark.rows import batch_dicts
from cdcflow.spark.schema import CHANGE_COLUMNS, arrow_of

pytestmark = pytest.mark.property

MICROS = st.integers(-30_610_224_000_000_000, 221_845_392_000_000_000)
"""Years 1000 to 9000: a zone's offset never takes pyarrow's own conversion past 1..9999."""
ZONES = st.sampled_from([None, "UTC", "+00:00", "Europe/Paris"])
UNITS = st.sampled_from(["s", "ms", "us", "ns"])


@st.composite
def timestamp_batches(draw: Any) -> pa.RecordBatch:
    """A few rows: a string column and timestamp columns of any unit and zone, nulls too;
    values repeat (as the mods of one transaction share their commit time)."""
    rows = draw(st.integers(0, 12))
    pool = draw(st.lists(MICROS, min_size=1, max_size=3))
    arrays, names = [pa.array([str(i) for i in range(rows)])], ["name"]
    for index in range(draw(st.integers(1, 3))):
        unit, zone = draw(UNITS), draw(ZONES)
        per_unit = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}[unit]
        values = [None if draw(st.booleans()) and draw(st.booleans())
                  else draw(st.sampled_from(pool)) // per_unit for _ in range(rows)]
        if unit == "ns":
            values = [None if v is None else max(min(v, 9_000_000_000_000_000), -(9 * 10**15))
                      for v in values]
        arrays.append(pa.array(values, pa.int64()).cast(pa.timestamp(unit, tz=zone)))
        names.append(f"t{index}")
    return pa.RecordBatch.from_arrays(arrays, names=names)


@given(timestamp_batches())
@settings(max_examples=300, deadline=None)
def test_batch_dicts_equal_pyarrows_rows(batch: pa.RecordBatch):
    plain, fast = batch.to_pylist(), batch_dicts(batch)
    assert fast == plain
    for mine, theirs in zip(fast, plain, strict=True):  # equal, and zoned the same way
        for name, value in theirs.items():
            assert type(mine[name]) is type(value)
            if value is not None and hasattr(value, "tzinfo"):
                assert (mine[name].tzinfo is None) == (value.tzinfo is None)
                assert mine[name].utcoffset() == value.utcoffset()
                assert mine[name].tzinfo in (None, UTC) or repr(mine[name].tzinfo) == repr(
                    value.tzinfo)


def test_batch_dicts_of_the_sources_own_schema_equal_pyarrows_rows():
    schema = arrow_of(CHANGE_COLUMNS)
    row = {"commit_timestamp": 1_700_000_000_123_456, "source_timestamp": 1_700_000_000_000_001}
    columns = []
    for field in schema:
        if pa.types.is_timestamp(field.type):
            columns.append(pa.array([row[field.name], None, row[field.name]],
                                    pa.int64()).cast(field.type))
        else:
            columns.append(pa.nulls(3, field.type))
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    assert batch_dicts(batch) == batch.to_pylist()
    assert batch_dicts(batch)[0]["commit_timestamp"].microsecond == 123_456


SECTION = st.text("0123456789abcdefABCDEF", min_size=1, max_size=16)
SEQUENCE_TEXT = st.one_of(
    st.lists(SECTION, min_size=1, max_size=4).map("/".join),
    st.text("0123456789abcdefABCDEF/xg -", max_size=40),
    st.lists(st.text("0123456789abcdef", min_size=0, max_size=18), min_size=0,
             max_size=6).map("/".join),
)


@given(st.one_of(SEQUENCE_TEXT, st.none(), st.integers()))
@settings(max_examples=500, deadline=None)
def test_sort_keys_equal_those_of_parsed_sequence_numbers(text: Any):
    """AP-4: the same key for every well-formed text, the same error for any other."""
    if text is None:
        assert sort_key_of(text) == ""
        return
    try:
        expected = ChangeSequenceNumber.parse(text).sort_key
    except InvalidArgument as error:
        with pytest.raises(InvalidArgument) as raised:
            sort_key_of(text)
        assert str(raised.value) == str(error)
        return
    assert sort_key_of(text) == expected


EDGES = st.one_of(st.integers(-2, 2), st.integers((1 << 64) - 3, (1 << 64) + 1),
                  st.integers(-3, (1 << 64) + 3))
"""Section values around both ends of 0..2^64-1, and anywhere."""


@given(st.lists(EDGES, min_size=0, max_size=5))
@example([(1 << 64) - 1] * 3)
@example([0, 0, 1 << 64])
@example([-1, 0, 0])
@settings(max_examples=300, deadline=None)
def test_sequence_texts_equal_built_sequence_numbers(values: list[int]):
    try:
        expected = str(ChangeSequenceNumber.from_ints(*values))
    except InvalidArgument as error:
        with pytest.raises(InvalidArgument) as raised:
            sequence_text(*values)
        assert str(raised.value) == str(error)
        return
    assert sequence_text(*values) == expected
    assert ChangeSequenceNumber.parse(expected).sections == tuple(values)


COLUMN = st.builds(
    lambda name, code, key, at: ColumnTypeInfo(name, ColumnType(code), key, at),
    st.sampled_from(["Id", "Name", "At"]), st.sampled_from(["INT64", "STRING", "JSON"]),
    st.booleans(), st.integers(1, 4))


@given(st.lists(COLUMN, max_size=4), st.sampled_from(["Orders", "shop.orders", "a"]),
       st.sampled_from(["Orders", "b"]))
@settings(max_examples=200, deadline=None)
def test_schema_keys_found_by_identity_equal_fresh_ones(columns: list[ColumnTypeInfo],
                                                        first: str, second: str):
    """EV-2: a tuple seen before gives each object name its own key, equal to the key of an
    equal tuple never seen; another name or other columns give another key."""
    shared = tuple(columns)
    fresh = events_module._schema_key.__wrapped__  # the uncached computation
    assert schema_key(first, shared) == fresh(first, tuple(columns))
    assert schema_key(second, shared) == fresh(second, tuple(columns))
    assert (schema_key(first, shared) == schema_key(second, shared)) == (first == second)
    assert schema_key(first, shared) == schema_key(first, list(columns))


FLOATS = st.floats(allow_nan=False, allow_infinity=False)
ENCODED = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), FLOATS,
              st.text(), st.sampled_from(["NaN", "Infinity", "-Infinity"])),
    lambda inner: st.lists(inner, max_size=3), max_leaves=8)


@given(st.dictionaries(st.text(max_size=8), ENCODED, max_size=5))
@settings(max_examples=400, deadline=None)
def test_mod_values_read_with_orjson_equal_those_read_with_json(values: dict[str, Any]):
    """The source writes a mod's keys and values with orjson (`read_changes`); the fold and
    the events read them back with orjson: the same values as the standard library's."""
    text = orjson.dumps(values).decode()
    fast, plain = orjson.loads(text), json.loads(text)
    assert fast == plain
    assert list(fast) == list(plain)
    for name, value in plain.items():
        if isinstance(value, float) and value == 0:
            assert math.copysign(1, fast[name]) == math.copysign(1, value)


POSITION_NAMES = st.sampled_from(["lsn", "log_file", "log_position", "database", "tx_id",
                                  "record_sequence", "partition_token", "table", "schema",
                                  "target", "moved_to", "moved_from", "part", "change_type",
                                  "primary_keys", "other"])


def plain_source_fields(kind: SourceKind, change: Change, database: str) -> dict[str, Any]:
    """EV-4's source metadata as first written: one dict after another, per change."""
    known = {"database": database, "tx_id": change.source.tx_id,
             "record_sequence": change.record_sequence,
             "partition_token": change.partition_token, **change.position}
    keys = [c.name for c in change.column_types if c.is_primary_key]
    fields = {name: known.get(name) for name in kind.fields}
    return fields | object_parts(kind, change.table) | {
        "change_type": change_type(kind, change), "is_deleted": change.mod_type == "DELETE",
        "primary_keys": keys}


@given(st.sampled_from(KINDS), st.sampled_from(["Orders", "shop.orders", "a.b.c"]),
       st.lists(COLUMN, max_size=4), st.sampled_from(["INSERT", "UPDATE", "DELETE"]),
       st.lists(st.dictionaries(POSITION_NAMES, st.one_of(st.integers(), st.text(max_size=3)),
                                max_size=4), min_size=1, max_size=3),
       st.sampled_from(["db", "other"]))
@settings(max_examples=400, deadline=None)
def test_source_fields_from_a_template_equal_the_plain_ones(
        kind: SourceKind, table: str, columns: list[ColumnTypeInfo], mod_type: str,
        positions: list[dict[str, Any]], database: str):
    """EV-4: changes of one table (one column-types tuple) get, in the same key order, the
    source metadata of the plain formula: a position's field wins over the database, the
    transaction id, the record sequence and the partition token; the object's naming fields
    and the generic fields win over everything; each event gets a list of keys of its own."""
    shared = tuple(columns)
    source = SourceMetadata(kind.cdc_method, datetime(2026, 1, 2, tzinfo=UTC), "tx-9")
    made = []
    for index, position in enumerate(positions):
        change = Change(table, mod_type, shared, 1, "9", f"{index:08d}", index, "P1", source,
                        position)
        fast, plain = source_fields(kind, change, database), plain_source_fields(
            kind, change, database)
        assert fast == plain
        assert list(fast) == list(plain)
        made.append(fast)
    made[0]["primary_keys"].append("mutated")
    assert all(m["primary_keys"] == [c.name for c in columns if c.is_primary_key]
               for m in made[1:])
