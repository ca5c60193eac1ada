"""Column types stored once per file (log format 4, `cdcflow.store.record_types`): a reader
gets back every body as the writer gave it, byte for byte."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.errors import DataLoss
from cdcflow.model.records import ColumnTypeInfo, DataChangeRecord, Mod
from cdcflow.model.types import ColumnType
from cdcflow.store import log, record_types
from cdcflow.store.capture import encode_record
from cdcflow.store.sqlite import connect, initialise, write_transaction


def _body(names: list[str], value: str) -> str:
    types = tuple(ColumnTypeInfo(n, ColumnType("STRING"), i == 0, i + 1)
                  for i, n in enumerate(names))
    return encode_record(DataChangeRecord(
        commit_timestamp=datetime(2026, 1, 1, tzinfo=UTC), record_sequence="00000000",
        server_transaction_id="1", is_last_record_in_transaction_in_partition=True,
        table_name="T", column_types=types,
        mods=(Mod({names[0]: value}, {n: value for n in names[1:]}, {}),),
        mod_type="INSERT", value_capture_type="NEW_ROW", number_of_records_in_transaction=1,
        number_of_partitions_in_transaction=1))


_NAMES = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4, unique=True)


@given(_NAMES, st.text(max_size=30))
def test_a_record_body_splits_into_its_column_types_and_joins_back(names: list[str],
                                                                    value: str):
    """Column names and values with quotes, brackets or `,"mods":` in them included."""
    body = _body(names, value)
    types, rest = record_types.split(body)
    assert types is not None and types.startswith("[") and types.endswith("]")
    assert rest.startswith('{"mods":') and len(rest) < len(body)
    assert record_types.joined(types, rest) == body


@given(st.text(max_size=200))
def test_any_text_is_kept_whole_or_split_and_joined_back_exactly(text: str):
    for body in (text, '{"column_types":' + text, '{"column_types":' + text + ',"mods":[]}'):
        types, rest = record_types.split(body)
        assert (rest if types is None else record_types.joined(types, rest)) == body


def _row(micros: int, body: str) -> log.DataRow:
    return log.DataRow("s", "P0", micros, 0, 1, body)


def _read(conn: sqlite3.Connection) -> list[str]:
    return [body for _, _, _, body in log.records_after(conn, "s", "P0", (0, -1), None, 100)]


def test_records_share_one_row_of_column_types_and_read_back_whole(tmp_path: Path):
    conn = connect(str(tmp_path / "log.db"))
    initialise(conn)
    bodies = [_body(["id", "v"], "a"), _body(["id", "v"], "b"), _body(["id", "w"], "c")]
    with write_transaction(conn):
        log.insert_data_records(conn, [_row(i + 1, b) for i, b in enumerate(bodies)])
    plain = sqlite3.connect(tmp_path / "log.db")  # no caches: looked up
    assert _read(conn) == _read(plain) == bodies
    assert plain.execute("SELECT types FROM _log ORDER BY commit_micros").fetchall() == [
        (1,), (1,), (2,)]
    stored = plain.execute("SELECT SUM(LENGTH(body)) FROM _log").fetchone()[0]
    assert stored < sum(map(len, bodies)) * 0.8


def test_a_rolled_back_write_forgets_the_column_types_it_added(tmp_path: Path):
    """The connection's cache of ids would otherwise name a row the rollback removed."""
    conn = connect(str(tmp_path / "log.db"))
    initialise(conn)
    body = _body(["id", "v"], "a")
    with pytest.raises(RuntimeError), write_transaction(conn):
        log.insert_data_records(conn, [_row(1, body)])
        raise RuntimeError("the commit fails after its records were inserted")
    with write_transaction(conn):
        log.insert_data_records(conn, [_row(2, body)])
    assert _read(conn) == [body]
    assert _read(sqlite3.connect(tmp_path / "log.db")) == [body]


def test_a_child_partitions_record_keeps_its_whole_body(tmp_path: Path):
    conn = connect(str(tmp_path / "log.db"))
    initialise(conn)
    with write_transaction(conn):
        log.insert_child_record(conn, "s", "P0", 5, '{"start_micros": 5, "children": []}')
    assert _read(conn) == ['{"start_micros": 5, "children": []}']
    assert conn.execute("SELECT types FROM _log").fetchall() == [(None,)]


def test_a_record_naming_column_types_the_file_lacks_is_data_loss(tmp_path: Path):
    conn = connect(str(tmp_path / "log.db"))
    initialise(conn)
    with write_transaction(conn):
        log.insert_data_records(conn, [_row(1, _body(["id", "v"], "a"))])
    plain = sqlite3.connect(tmp_path / "log.db")
    with plain:
        plain.execute("DELETE FROM _column_types")
    with pytest.raises(DataLoss, match="column types 1"):
        _read(sqlite3.connect(tmp_path / "log.db"))
