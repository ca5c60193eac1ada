"""A native commit's log entries, encoded straight from its row changes (`native_entries`),
are what the plain path gives: `build_records` then `encode_record` (CS-7: one record per
stream, table, mod type and partition; sequence numbers; last-in-partition flags; counts).
Random transactions over two tables, streams of every value capture type and column choice,
and several partitions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.model.schema import VALUE_CAPTURE_TYPES, ChangeStreamDef, Column, TableSchema
from cdcflow.model.timestamps import from_micros
from cdcflow.model.types import ColumnType
from cdcflow.store.capture import PartitionRanges, RowChange, build_records, encode_record
from cdcflow.store.native_entries import native_entries

pytestmark = pytest.mark.property

ORDERS = TableSchema("Orders", (
    Column("Id", ColumnType("INT64"), not_null=True),
    Column("Note", ColumnType("STRING")),
    Column("Amount", ColumnType("FLOAT64")),
), ("Id",))
LINES = TableSchema("Lines", (
    Column("Order", ColumnType("INT64"), not_null=True),
    Column("Line", ColumnType("STRING"), not_null=True),
    Column("Qty", ColumnType("INT64")),
    Column("Sku", ColumnType("STRING")),
), ("Order", "Line"))
SCHEMAS = (ORDERS, LINES)

values = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3))


@st.composite
def row_changes(draw: Any) -> RowChange:
    schema = draw(st.sampled_from(SCHEMAS))
    key = {name: draw(st.integers(0, 3)) if name != "Line" else draw(st.text(max_size=2))
           for name in schema.primary_key}
    columns = [c.name for c in schema.non_key_columns]

    def row() -> dict[str, Any]:
        return key | {name: draw(values) for name in columns}

    before = draw(st.one_of(st.none(), st.builds(row)))
    after = draw(st.one_of(st.none(), st.builds(row)))
    written = set(draw(st.lists(st.sampled_from(columns), unique=True)))
    return RowChange(schema, str(sorted(key.items())), draw(st.integers(0, 2**63 - 1)),
                     before, after, written)


@st.composite
def change_streams(draw: Any, name: str) -> ChangeStreamDef:
    capture = draw(st.sampled_from(VALUE_CAPTURE_TYPES))
    if draw(st.booleans()):
        return ChangeStreamDef(name, True, (), 10**9, capture, 0)
    tables = []
    for schema in draw(st.lists(st.sampled_from(SCHEMAS), unique_by=lambda s: s.name,
                                min_size=1)):
        columns = [c.name for c in schema.non_key_columns]
        chosen = draw(st.one_of(st.none(), st.lists(st.sampled_from(columns), unique=True)))
        tables.append((schema.name, None if chosen is None else tuple(chosen)))
    return ChangeStreamDef(name, False, tuple(tables), 10**9, capture, 0)


@st.composite
def partition_ranges(draw: Any) -> PartitionRanges:
    starts = sorted(set(draw(st.lists(st.integers(1, 2**63 - 1), max_size=4))))
    return PartitionRanges((0, *starts), tuple(f"t{i}" for i in range(len(starts) + 1)))


@settings(max_examples=400, deadline=None)
@given(st.lists(row_changes(), max_size=8),
       st.lists(st.sampled_from(["S1", "S2", "S3"]), unique=True, max_size=3).flatmap(
           lambda names: st.tuples(*(change_streams(n) for n in names))),
       st.lists(partition_ranges(), min_size=3, max_size=3), st.integers(0, 4 * 10**15),
       st.integers(1, 10**6))
def test_native_entries_are_the_encoded_plain_records(changes, streams, ranges, micros, txn):
    """Each stream has partitions of its own (tokens named after it)."""
    ranges_of = {s.name: PartitionRanges(r.starts, tuple(f"{s.name}-{t}" for t in r.tokens))
                 for s, r in zip(streams, ranges, strict=False)}.__getitem__
    plain = [(e.stream, e.token, e.sequence, len(e.record.mods), encode_record(e.record))
             for e in build_records(changes, list(streams), ranges_of, from_micros(micros),
                                    str(txn))]
    fast = native_entries(changes, list(streams), ranges_of, micros, str(txn))
    assert [tuple(e) for e in fast] == plain


def test_a_schema_changed_by_ddl_gets_its_own_column_types():
    """The per-(stream, schema) memo is by identity: a new schema object (after DDL) is
    worked out again, so a record never carries an older table's column types."""
    stream = ChangeStreamDef("S", True, (), 10**9, "NEW_ROW", 0)
    wider = TableSchema("Orders", (*ORDERS.columns, Column("Paid", ColumnType("BOOL"))),
                        ("Id",))
    ranges = PartitionRanges((0,), ("t0",))
    for schema in (ORDERS, wider, ORDERS):
        change = RowChange(schema, "[1]", 5, None, {c.name: None for c in schema.columns} | {
            "Id": "1"})
        (fast,) = native_entries([change], [stream], lambda _: ranges, 10, "1")
        (plain,) = build_records([change], [stream], lambda _: ranges, from_micros(10), "1")
        assert fast.body == encode_record(plain.record)
        assert ('"Paid"' in fast.body) == (schema is wider)
