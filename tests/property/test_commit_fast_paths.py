"""The embedded commit path's shortcuts give what the plain paths give (CS-1, CS-7).

A commit reads the touched rows in bulk (`latest_versions`), keeps a buffered mutation's
validation unless the schema changed since (`Mutation.checked_against`), tests common values
cheaply (`TableShape.quick`), writes integer keys and rows without the standard JSON encoder.
Each must agree with the path it shortcuts.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow import Database
from cdcflow.errors import CdcflowError, TypeMismatch
from cdcflow.model.schema import Column, TableSchema
from cdcflow.model.types import ColumnType, validate_value
from cdcflow.store.mutations import Mutation, validate_mutation
from cdcflow.store.rows import encode_row, latest_version, latest_versions

pytestmark = pytest.mark.property

TABLE = ("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(8), Amount FLOAT64, "
         "Paid BOOL) PRIMARY KEY (Id)")
SCHEMA = TableSchema("Orders", (
    Column("Id", ColumnType("INT64"), not_null=True),
    Column("Note", ColumnType("STRING", length=8)),
    Column("Amount", ColumnType("FLOAT64")),
    Column("Paid", ColumnType("BOOL")),
), ("Id",))

loose_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64),
                         st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=4))
rows = st.fixed_dictionaries({"Id": st.integers(0, 6)},
                             optional={"Note": loose_values, "Amount": loose_values,
                                       "Paid": loose_values})


def _plain_validate(values: dict[str, Any]) -> dict[str, Any] | str:
    """Every value through the full type check (the key is never NULL here)."""
    try:
        return {name: validate_value(value, SCHEMA.column(name).type, name)
                for name, value in values.items()}
    except CdcflowError as error:
        return type(error).__name__


def _outcome(schema: TableSchema, values: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return validate_mutation(schema, Mutation("insert_or_update", "Orders", values)).values
    except CdcflowError as error:
        return type(error).__name__


@settings(max_examples=300, deadline=None)
@given(rows)
def test_the_quick_column_tests_accept_and_refuse_what_the_full_checks_do(values):
    fast = _outcome(SCHEMA, values)
    plain = _plain_validate(values)
    assert fast == plain
    if isinstance(fast, dict):
        assert [type(v) for v in fast.values()] == [type(v) for v in plain.values()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3))
def test_an_integer_key_is_encoded_as_the_standard_encoder_writes_it(key):
    columns = tuple(Column(f"K{i}", ColumnType("INT64"), not_null=True)
                    for i in range(len(key)))
    schema = TableSchema("T", columns, tuple(c.name for c in columns))
    assert schema.encode_key(tuple(key)) == json.dumps(key, separators=(",", ":"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.text(max_size=6)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                  max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=4))
def test_a_stored_row_reads_back_exactly_even_with_integers_beyond_64_bits(row):
    assert json.loads(encode_row(row)) == row


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(rows, min_size=1, max_size=4), min_size=1, max_size=6),
       st.lists(st.integers(0, 9), min_size=1, max_size=9))
def test_bulk_reads_of_touched_rows_equal_reads_key_by_key(transactions, asked):
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "shop.db")
        database = Database.open(path)
        database.ddl(TABLE)
        for mutations in transactions:
            try:
                with database.transaction() as tx:
                    for values in mutations:
                        tx.insert_or_update("Orders", values)
            except CdcflowError:
                pass  # a bad value: nothing of this transaction is written
        storage = database._catalog().storage("Orders")
        keys = [json.dumps([k]) for k in asked]
        conn = sqlite3.connect(path)
        bulk = latest_versions(conn, storage, keys)
        assert bulk == {k: latest_version(conn, storage, k) for k in keys}
        conn.close()
        database.close()


def test_a_mutation_buffered_before_its_table_changed_is_checked_again_at_commit(tmp_path):
    """CS-1: the schema at commit decides; the transaction then writes nothing."""
    path = str(tmp_path / "shop.db")
    database = Database.open(path)
    database.ddl(TABLE)
    other = Database.open(path)
    tx = database.transaction()
    tx.insert("Orders", {"Id": 1, "Note": "short", "Amount": 1.5})
    other.ddl("DROP TABLE Orders")
    other.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(8), Amount STRING(8)) "
              "PRIMARY KEY (Id)")
    with pytest.raises(TypeMismatch, match="Amount"):
        tx.commit()
    assert other.read_row("Orders", 1) is None
    database.close()
    other.close()
