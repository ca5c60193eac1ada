"""Value capture types, watched column subsets, ALTER/DROP CHANGE STREAM, and the SQL form."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from cdcflow import Database, DataChangeRecord

pytestmark = pytest.mark.unit

TABLE = "CREATE TABLE P (Id INT64 NOT NULL, A STRING(MAX), B INT64, C BOOL) PRIMARY KEY (Id)"


def records(db: Database, stream: str, start: datetime) -> list[DataChangeRecord]:
    end = db.current_timestamp()
    (first,) = db.read_change_stream(stream, start, end, None, 1000)
    assert first.child_partitions_record is not None
    out = []
    for child in first.child_partitions_record.child_partitions:
        for row in db.read_change_stream(stream, start, end, child.token, 1000):
            if row.data_change_record is not None:
                out.append(row.data_change_record)
    return sorted(out, key=lambda r: (r.commit_timestamp, r.record_sequence))


def workload(db: Database) -> None:
    with db.transaction() as tx:
        tx.insert("P", {"Id": 1, "A": "a", "B": 1, "C": True})
    with db.transaction() as tx:
        tx.update("P", {"Id": 1, "B": 2})
    with db.transaction() as tx:
        tx.update("P", {"Id": 1, "C": False})
    with db.transaction() as tx:
        tx.delete("P", {"Id": 1})


def mods(found: list[DataChangeRecord]) -> list[tuple[str, dict, dict]]:
    return [(r.mod_type, r.mods[0].new_values, r.mods[0].old_values) for r in found]


EXPECTED = {
    "OLD_AND_NEW_VALUES": [
        ("INSERT", {"A": "a", "B": 1, "C": True}, {}),
        ("UPDATE", {"B": 2}, {"B": 1}),
        ("UPDATE", {"C": False}, {"C": True}),
        ("DELETE", {}, {"A": "a", "B": 2, "C": False}),
    ],
    "NEW_VALUES": [
        ("INSERT", {"A": "a", "B": 1, "C": True}, {}),
        ("UPDATE", {"B": 2}, {}),
        ("UPDATE", {"C": False}, {}),
        ("DELETE", {}, {}),
    ],
    "NEW_ROW": [
        ("INSERT", {"A": "a", "B": 1, "C": True}, {}),
        ("UPDATE", {"A": "a", "B": 2, "C": True}, {}),
        ("UPDATE", {"A": "a", "B": 2, "C": False}, {}),
        ("DELETE", {}, {}),
    ],
    "NEW_ROW_AND_OLD_VALUES": [
        ("INSERT", {"A": "a", "B": 1, "C": True}, {}),
        ("UPDATE", {"A": "a", "B": 2, "C": True}, {"B": 1}),
        ("UPDATE", {"A": "a", "B": 2, "C": False}, {"C": True}),
        ("DELETE", {}, {"A": "a", "B": 2, "C": False}),
    ],
}


@pytest.mark.parametrize("capture", sorted(EXPECTED))
def test_value_capture_types(db: Database, capture: str):
    db.ddl(TABLE)
    db.ddl(f"CREATE CHANGE STREAM S FOR P OPTIONS (value_capture_type = '{capture}')")
    start = db.current_timestamp()
    workload(db)
    found = records(db, "S", start)
    assert mods(found) == EXPECTED[capture]
    assert {r.value_capture_type for r in found} == {capture}
    assert all(r.mods[0].keys == {"Id": 1} for r in found)


def test_watched_column_subset_sees_only_those_columns(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR P(B)")
    start = db.current_timestamp()
    workload(db)
    found = records(db, "S", start)
    # the update of C alone touches no watched column: no record
    assert mods(found) == [
        ("INSERT", {"B": 1}, {}),
        ("UPDATE", {"B": 2}, {"B": 1}),
        ("DELETE", {}, {"B": 2}),
    ]
    assert [c.name for c in found[0].column_types] == ["Id", "B"]
    assert [c.ordinal_position for c in found[0].column_types] == [1, 3]


def test_key_only_stream_and_unwatched_tables(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE TABLE Q (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR P()")
    start = db.current_timestamp()
    workload(db)
    with db.transaction() as tx:
        tx.insert("Q", {"Id": 1})
    assert mods(records(db, "S", start)) == [("INSERT", {}, {}), ("DELETE", {}, {})]


def test_alter_change_stream_scope_and_options(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE TABLE Q (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR P")
    db.ddl("ALTER CHANGE STREAM S SET FOR Q")
    db.ddl("ALTER CHANGE STREAM S SET OPTIONS (retention_period = '36h', "
           "value_capture_type = 'NEW_ROW')")
    definition = db.change_stream("S")
    assert definition.tables == (("Q", None),)
    assert definition.retention_micros == 36 * 3600 * 10**6
    assert definition.value_capture_type == "NEW_ROW"
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("P", {"Id": 1})
        tx.insert("Q", {"Id": 1, "V": 5})
    found = records(db, "S", start)
    assert [(r.table_name, r.value_capture_type) for r in found] == [("Q", "NEW_ROW")]
    db.ddl("ALTER CHANGE STREAM S DROP FOR ALL")
    second = db.current_timestamp() + timedelta(microseconds=1)
    with db.transaction() as tx:
        tx.update("Q", {"Id": 1, "V": 6})
    assert records(db, "S", second) == []
    db.ddl("DROP CHANGE STREAM S")
    assert db.change_streams() == []


def test_add_column_is_captured_after_alter(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("P", {"Id": 1, "A": "x"})
    db.ddl("ALTER TABLE P ADD COLUMN D DATE")
    assert db.read_row("P", 1) == {"Id": 1, "A": "x", "B": None, "C": None, "D": None}
    with db.transaction() as tx:
        tx.update("P", {"Id": 1, "D": __import__("datetime").date(2024, 1, 2)})
    found = records(db, "S", start)
    assert mods(found)[-1] == ("UPDATE", {"D": "2024-01-02"}, {"D": None})
    assert found[-1].column_types[-1].type.code == "DATE"


def test_net_effect_of_several_mutations_on_one_row(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("P", {"Id": 1, "A": "a"})
        tx.update("P", {"Id": 1, "B": 3})
        tx.insert("P", {"Id": 2})
        tx.delete("P", {"Id": 2})
    found = records(db, "S", start)
    assert mods(found) == [("INSERT", {"A": "a", "B": 3, "C": None}, {})]


def test_execute_sql_named_and_positional(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    workload(db)
    end = db.current_timestamp()
    rows = list(db.execute_sql(
        "SELECT ChangeRecord FROM READ_S(start_timestamp => @start, end_timestamp => @end, "
        "partition_token => NULL, heartbeat_milliseconds => 10000)",
        params={"start": start, "end": end},
    ))
    assert len(rows) == 1 and len(rows[0][0]) == 1
    child = rows[0][0][0].child_partitions_record
    assert child is not None and child.child_partitions[0].parent_partition_tokens == ()
    token = child.child_partitions[0].token
    data = list(db.execute_sql(
        f"SELECT ChangeRecord FROM READ_S(@start, @end, '{token}', 1000)",
        params={"start": start, "end": end},
    ))
    assert [r[0][0].data_change_record.mod_type for r in data] == [
        "INSERT", "UPDATE", "UPDATE", "DELETE"
    ]


def test_drop_table_removes_rows_and_unwatched_streams_keep_working(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE TABLE Q (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    with db.transaction() as tx:
        tx.insert("P", {"Id": 1})
        tx.insert("Q", {"Id": 1})
    db.ddl("DROP TABLE P")
    assert db.tables() == ["Q"]
    from cdcflow.errors import NotFound

    with pytest.raises(NotFound, match="'P'"):
        db.read_row("P", 1)
    start = db.current_timestamp() + timedelta(microseconds=1)
    with db.transaction() as tx:
        tx.insert("Q", {"Id": 2})
    assert [r.table_name for r in records(db, "S", start)] == ["Q"]
    db.ddl(TABLE)  # the name can be used again, with no rows
    assert db.scan("P") == []


def test_a_column_added_by_this_process_is_writable_at_once(db: Database):
    db.ddl("CREATE TABLE A (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.table_schema("A")  # cached by this session
    db.ddl("ALTER TABLE A ADD COLUMN Note STRING(MAX)")
    with db.transaction() as tx:
        tx.insert("A", {"Id": 1, "Note": "new"})
    assert db.read_row("A", 1) == {"Id": 1, "Note": "new"}
