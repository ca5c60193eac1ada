"""CDC tables (AP-1..AP-10): the seed's example, staleness timeline, errors, watermarks."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdcflow import FakeClock
from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from cdcflow.table import CdcTable

pytestmark = pytest.mark.unit
SCHEMA = "id INT64 NOT NULL, name STRING(MAX), salary INT64"


def rows(table: CdcTable) -> list[tuple]:
    return sorted((r["id"], r["name"], r["salary"]) for r in table.to_arrow().to_pylist())


def test_seed_example(tmp_path: Path):
    table = CdcTable.create(tmp_path / "employees", SCHEMA, ["id"])
    table.connection().append([
        {"id": 100, "name": "Charlie", "salary": 2000, "_CHANGE_TYPE": "UPSERT"},
        {"id": 101, "name": "Tal", "salary": 3000, "_CHANGE_TYPE": "UPSERT"},
        {"id": 102, "name": "Lee", "salary": 5000, "_CHANGE_TYPE": "UPSERT"},
    ])
    table.apply()
    table.connection().append([
        {"id": 100, "_CHANGE_TYPE": "DELETE"},
        {"id": 101, "name": "Tal", "salary": 8000, "_CHANGE_TYPE": "UPSERT"},
        {"id": 105, "name": "Izumi", "salary": 6000, "_CHANGE_TYPE": "UPSERT"},
    ])
    expected = [(101, "Tal", 8000), (102, "Lee", 5000), (105, "Izumi", 6000)]
    assert rows(table) == expected  # no max_staleness: a runtime merge
    table.apply()
    assert rows(table) == expected
    plain = DeltaTable(str(tmp_path / "employees")).to_pyarrow_table()
    assert sorted(plain.column_names) == ["id", "name", "salary"]  # AP-10
    assert sorted(r["id"] for r in plain.to_pylist()) == [101, 102, 105]


def test_staleness_timeline_alter_and_options(tmp_path: Path):
    """AP-5 and AP-6: the upsert_stream_apply_watermark, read from the table's metadata, is
    the time of the last apply; reads inside max_staleness return that version."""
    clock = FakeClock()
    t0 = clock.now()
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], max_staleness=timedelta(minutes=10),
                            clock=clock)
    assert table.upsert_stream_apply_watermark is None
    assert table.options["max_staleness"] == timedelta(minutes=10)
    connection = table.connection()
    connection.append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT"}])
    clock.advance(timedelta(minutes=20))
    table.apply()  # the last apply at T20
    assert table.upsert_stream_apply_watermark == t0 + timedelta(minutes=20)
    connection.append([{"id": 1, "name": "a", "salary": 2, "_CHANGE_TYPE": "UPSERT"},
                       {"id": 2, "name": "b", "salary": 3, "_CHANGE_TYPE": "UPSERT"}])
    clock.advance(timedelta(minutes=5))  # T25: within staleness, the T20 version
    assert rows(table) == [(1, "a", 1)]
    clock.advance(timedelta(minutes=10))  # T35: outside, a runtime merge
    assert rows(table) == [(1, "a", 2), (2, "b", 3)]
    assert table.upsert_stream_apply_watermark == t0 + timedelta(minutes=20)
    table.alter(max_staleness=timedelta(minutes=15))  # T35 - T20 = 15: inside again
    assert CdcTable.open(tmp_path / "t").options["max_staleness"] == timedelta(minutes=15)
    assert rows(table) == [(1, "a", 1)]
    with pytest.raises(InvalidArgument, match="cannot be altered"):
        table.alter(primary_key=["name"])
    with pytest.raises(InvalidArgument, match="must be positive"):
        table.alter(max_staleness=timedelta(0))


def test_a_delete_is_applied_once_the_watermark_passes_its_streaming(tmp_path: Path):
    """AP-6: a DELETE streamed after the watermark is not applied yet (the stored table
    still has the row); an apply moves the watermark, read back from metadata, past it."""
    clock = FakeClock()
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], clock=clock)
    table.connection().append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT"}])
    table.apply()

    def stored() -> list[int]:
        return [r["id"] for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()]

    streamed = clock.advance(timedelta(minutes=1))
    table.connection().append([{"id": 1, "_CHANGE_TYPE": "DELETE"}])
    assert CdcTable.open(tmp_path / "t").upsert_stream_apply_watermark < streamed
    assert stored() == [1] and table.has_pending_changes()
    clock.advance(timedelta(minutes=1))
    table.apply()
    assert CdcTable.open(tmp_path / "t").upsert_stream_apply_watermark > streamed
    assert stored() == [] and not table.has_pending_changes()


def test_connection_mixing_change_types_fails_and_keeps_nothing(tmp_path: Path):
    """AP-3: UPSERT/DELETE rows and INSERT or untyped rows on one connection are refused
    with 'The given value is not a valid CHANGE_TYPE'."""
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    connection = table.connection()
    connection.append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT"}])
    for bad in ([{"id": 2, "_CHANGE_TYPE": "INSERT"}], [{"id": 2, "name": "x"}]):
        with pytest.raises(InvalidArgument, match="The given value is not a valid CHANGE_TYPE"):
            connection.append(bad)
    with pytest.raises(InvalidArgument, match="The given value is not a valid CHANGE_TYPE"):
        table.connection().append([{"id": 3, "_CHANGE_TYPE": "UPSERT"},
                                   {"id": 4, "_CHANGE_TYPE": "INSERT"}])
    with pytest.raises(InvalidArgument, match="'MERGE'"):
        table.connection().append([{"id": 3, "_CHANGE_TYPE": "MERGE"}])
    plain = table.connection()
    plain.append([{"id": 7, "name": "p", "salary": 7}])
    with pytest.raises(InvalidArgument, match="The given value is not a valid CHANGE_TYPE"):
        plain.append([{"id": 8, "_CHANGE_TYPE": "UPSERT"}])
    assert rows(table) == [(1, "a", 1), (7, "p", 7)]


BAD_ROWS = [
    ([{"id": 1, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "1/2/3/4/5"}], "row 0",
     "1 to 4 sections"),
    ([{"id": 1, "_CHANGE_TYPE": "UPSERT"}, {"id": 2, "_CHANGE_TYPE": "UPSERT",
                                            "_CHANGE_SEQUENCE_NUMBER": "G"}], "row 1", "'G'"),
    ([{"id": None, "_CHANGE_TYPE": "UPSERT"}], "row 0", "can't be NULL"),
    ([{"name": "x", "_CHANGE_TYPE": "UPSERT"}], "'id'", "can't be NULL"),
    ([{"id": 1, "bogus": 2, "_CHANGE_TYPE": "UPSERT"}], "bogus", "not in the table"),
    ([{"id": "one", "_CHANGE_TYPE": "UPSERT"}], "row 0: value 'one' does not fit column 'id'",
     "int64"),
    ([{"id": 1, "salary": 5, "_CHANGE_TYPE": "UPSERT"},
      {"id": 2, "salary": "lots", "_CHANGE_TYPE": "UPSERT"}],
     "row 1: value 'lots' does not fit column 'salary'", "int64"),
    ([{"id": 2**70, "_CHANGE_TYPE": "UPSERT"}], "row 0: value 1180591620717411303424",
     "column 'id'"),
    ([{"id": 1, "_CHANGE_TYPE": "UPSERT"}, {"id": 2, "salary": 2**63, "_CHANGE_TYPE": "UPSERT"}],
     "row 1: value 9223372036854775808 does not fit column 'salary'", "int64"),
    (pa.table({"id": [1, 2, 3], "salary": ["1", "2", "x"]}),
     "row 2: value 'x' does not fit column 'salary'", "int64"),
    (pa.table({"id": [1, 2**40]}).cast(pa.schema([("id", pa.int64())])).append_column(
        "name", pa.array([b"ok", b"\xff"], pa.binary())),
     "row 1: value b'\\xff' does not fit column 'name'", "string"),
]


@pytest.mark.parametrize(("data", "where", "rule"), BAD_ROWS)
def test_bad_rows_are_rejected_whole(tmp_path: Path, data: list, where: str, rule: str):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    with pytest.raises(InvalidArgument) as caught:
        table.connection().append(data)
    assert where in str(caught.value) and rule in str(caught.value)
    assert not table.has_pending_changes()


def test_create_rules(tmp_path: Path):
    with pytest.raises(InvalidArgument, match="1 to 16"):
        CdcTable.create(tmp_path / "a", SCHEMA, [])
    wide = pa.schema([(f"c{i}", pa.int64()) for i in range(17)])
    with pytest.raises(InvalidArgument, match="1 to 16"):
        CdcTable.create(tmp_path / "b", wide, [f"c{i}" for i in range(17)])
    huge = pa.schema([(f"c{i}", pa.int64()) for i in range(2001)])
    with pytest.raises(InvalidArgument, match="2000 columns"):
        CdcTable.create(tmp_path / "c", huge, ["c0"])
    with pytest.raises(InvalidArgument, match="reserved"):
        CdcTable.create(tmp_path / "d", "id INT64, _CHANGE_TYPE STRING(MAX)", ["id"])
    with pytest.raises(InvalidArgument, match="'nope'"):
        CdcTable.create(tmp_path / "e", SCHEMA, ["nope"])
    CdcTable.create(tmp_path / "f", SCHEMA, ["id", "name"])
    with pytest.raises(AlreadyExists):
        CdcTable.create(tmp_path / "f", SCHEMA, ["id"])


def test_sequence_numbers_beat_ingestion_order_and_ties_fall_back(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    connection = table.connection()
    connection.append([{"id": 1, "name": "new", "salary": 2, "_CHANGE_TYPE": "UPSERT",
                        "_CHANGE_SEQUENCE_NUMBER": "FFF/ABC"}])
    table.apply()
    connection.append([{"id": 1, "name": "old", "salary": 1, "_CHANGE_TYPE": "UPSERT",
                        "_CHANGE_SEQUENCE_NUMBER": "FFF/B"}])
    table.apply()
    assert rows(table) == [(1, "new", 2)]
    connection.append([{"id": 1, "name": "tie", "salary": 3, "_CHANGE_TYPE": "UPSERT",
                        "_CHANGE_SEQUENCE_NUMBER": "fff/abc"}])
    assert rows(table) == [(1, "tie", 3)]  # equal: the later ingestion wins


def test_tombstone_blocks_late_older_upsert_until_retention_ends(tmp_path: Path):
    clock = FakeClock()
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], delete_retention=timedelta(days=2),
                            clock=clock)
    connection = table.connection()
    connection.append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT",
                        "_CHANGE_SEQUENCE_NUMBER": "5"}])
    connection.append([{"id": 1, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": "9"}])
    table.apply()
    late = [{"id": 1, "name": "late", "salary": 0, "_CHANGE_TYPE": "UPSERT",
             "_CHANGE_SEQUENCE_NUMBER": "7"}]
    connection.append(late)
    table.apply()
    assert rows(table) == []
    clock.advance(timedelta(days=3))
    table.connection().append([{"id": 2, "_CHANGE_TYPE": "UPSERT"}])
    table.apply()  # the tombstone's window has passed: it is dropped
    connection.append(late)
    table.apply()
    assert rows(table) == [(1, "late", 0), (2, None, None)]


def test_exactly_once_appends_with_app_ids(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    batch = [{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT"}]
    connection = table.connection()
    assert connection.append(batch, app_id="q1", version=0)
    assert not connection.append(batch, app_id="q1", version=0)
    table.apply()
    assert not connection.append(batch, app_id="q1", version=0)  # still known after apply
    assert connection.append(batch, app_id="q1", version=1)
    assert not table.connection().append(batch, app_id="q1", version=1)


def test_jobs_recommendation_and_export(tmp_path: Path):
    """AP-8: apply job durations are observable and recommended_max_staleness is the larger
    of the tolerated staleness and twice the p95 duration plus a buffer. AP-9: exporting a
    table with unapplied changes refuses (apply_first=False) or applies them first."""
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    table.connection().append([{"id": i, "_CHANGE_TYPE": "UPSERT"} for i in range(10)])
    with pytest.raises(FailedPrecondition, match="unapplied"):
        table.export(tmp_path / "out.parquet", apply_first=False)
    assert table.export(tmp_path / "out.parquet") == 10
    table.apply()
    jobs = table.apply_jobs()
    assert len(jobs) == 2 and all(j["duration_seconds"] >= 0 for j in jobs)
    assert jobs[0]["version"] > jobs[1]["version"]
    p95 = max(j["duration_seconds"] for j in jobs)
    assert table.recommended_max_staleness(buffer=timedelta(0)) == timedelta(seconds=2 * p95)
    assert table.recommended_max_staleness(tolerated=timedelta(hours=1)) == timedelta(hours=1)


def test_files_split_and_only_touched_ranges_are_rewritten(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], target_file_rows=100)
    table.connection().append([{"id": i, "salary": i, "_CHANGE_TYPE": "UPSERT"}
                               for i in range(1000)])
    first = table.apply()
    assert first["rows"] == 1000
    files = len(DeltaTable(str(tmp_path / "t")).file_uris())
    assert files >= 5
    table.connection().append([{"id": 5, "salary": -5, "_CHANGE_TYPE": "UPSERT"},
                               {"id": 6, "_CHANGE_TYPE": "DELETE"}])
    second = table.apply()
    assert second["files_rewritten"] == 1
    assert len(table.to_arrow()) == 999
    background = CdcTable.create(tmp_path / "b", SCHEMA, ["id"],
                                 max_staleness=timedelta(milliseconds=200))
    background.connection().append([{"id": 1, "_CHANGE_TYPE": "UPSERT"}])
    background.start_background_apply()
    try:
        import time
        deadline = time.monotonic() + 10
        while background.upsert_stream_apply_watermark is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        background.stop_background_apply()
    assert background.upsert_stream_apply_watermark is not None
    assert not background.has_pending_changes()


def test_bulk_load_then_changes_and_lookup(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], target_file_rows=100)
    snapshot = pa.table({"id": list(range(1000)), "name": ["n"] * 1000,
                         "salary": list(range(1000))})
    stats = table.bulk_load(snapshot)
    assert stats["rows"] == 1000 and len(DeltaTable(str(tmp_path / "t")).file_uris()) == 10
    with pytest.raises(FailedPrecondition, match="empty table"):
        table.bulk_load(snapshot)
    other = CdcTable.create(tmp_path / "u", SCHEMA, ["id"])
    with pytest.raises(InvalidArgument, match="repeat a primary key"):
        other.bulk_load(pa.table({"id": [1, 1], "name": ["a", "b"], "salary": [1, 2]}))
    table.connection().append([{"id": 5, "name": "x", "salary": 0, "_CHANGE_TYPE": "UPSERT"},
                               {"id": 7, "_CHANGE_TYPE": "DELETE"},
                               {"id": 2000, "name": "new", "_CHANGE_TYPE": "UPSERT"}])
    assert table.lookup([(5,), (7,), (8,), (2000,), (99999,)]) == {
        (5,): {"id": 5, "name": "x", "salary": 0},
        (8,): {"id": 8, "name": "n", "salary": 8},
        (2000,): {"id": 2000, "name": "new", "salary": None},
    }
    job = table.apply()
    assert job["files_rewritten"] == 2  # the range of 5 and 7, and the last range
    assert len(table.to_arrow()) == 1000


def test_a_lookup_racing_an_apply_sees_the_applied_changes(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """An apply that commits between a reader's two looks (pending files, manifest) must not
    hide its changes from the reader: they are in one view or the other."""
    from cdcflow.table import apply as apply_module

    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    table.connection().append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT",
                                "_CHANGE_SEQUENCE_NUMBER": "1"}])
    table.apply()
    table.connection().append([{"id": 1, "name": "b", "salary": 2, "_CHANGE_TYPE": "UPSERT",
                                "_CHANGE_SEQUENCE_NUMBER": "2"}])
    real = apply_module.newest_manifest
    raced = []

    def racing(root: Any) -> Any:  # another process's apply commits right after this look
        seen = real(root)
        if not raced:
            raced.append(True)
            monkeypatch.setattr(apply_module, "newest_manifest", real)
            CdcTable.open(tmp_path / "t").apply()
        return seen

    monkeypatch.setattr(apply_module, "newest_manifest", racing)
    assert table.lookup([(1,)])[(1,)]["name"] == "b"
    assert raced


def test_add_columns_takes_repeats_and_finishes_after_a_crash(tmp_path: Path):
    from deltalake import DeltaTable
    from deltalake.schema import Schema as DeltaSchema

    from cdcflow.table.pending import pending_path

    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    note = pa.field("note", pa.string())
    assert table.add_columns([note, note, note]) == ["note"]  # one per Spark partition
    assert table.schema.names == ["id", "name", "salary", "note"]
    # a crash after the pending table gained a column and before the table did
    extra = DeltaSchema.from_arrow(pa.schema([pa.field("extra", pa.int64())])).fields
    DeltaTable(pending_path(table.root)).alter.add_columns(list(extra))
    assert table.add_columns([pa.field("extra", pa.int64())]) == ["extra"]
    table.connection().append([{"id": 1, "note": "n", "extra": 7, "_CHANGE_TYPE": "UPSERT"}])
    assert table.to_arrow().to_pylist() == [
        {"id": 1, "name": None, "salary": None, "note": "n", "extra": 7}]
    with pytest.raises(InvalidArgument, match="reserved"):
        table.add_columns([pa.field("_CHANGE_TYPE", pa.string())])


def test_delete_older_than_removes_rows_not_written_again(tmp_path: Path):
    """The sweep after a table is backfilled again: rows whose latest change is older than
    the backfill's start are deleted (applied or pending, bulk-loaded included), rows written
    since stay, a later change of a swept key still wins, and a second run deletes nothing."""
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    table.bulk_load(pa.table({"id": [1, 2], "name": ["a", "b"], "salary": [1, 2]}))
    connection = table.connection()
    connection.append([
        {"id": 3, "name": "c", "salary": 3, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "10/1/0"},
        {"id": 4, "name": "d", "salary": 4, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "10/2/0"},
        {"id": 5, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": "10/3/0"}])
    table.apply()
    connection.append([  # the backfill since 20: 2 and 4 are written again, pending
        {"id": 2, "name": "b2", "salary": 2, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "20/0/0"},
        {"id": 4, "name": "d2", "salary": 4, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "21/5/1"}])
    assert table.delete_older_than("20") == 2  # 1 (bulk-loaded) and 3
    assert rows(table) == [(2, "b2", 2), (4, "d2", 4)]
    assert table.delete_older_than("20") == 0
    connection.append([{"id": 1, "name": "back", "salary": 9, "_CHANGE_TYPE": "UPSERT",
                        "_CHANGE_SEQUENCE_NUMBER": "20/0/0"}])
    table.apply()
    assert rows(table) == [(1, "back", 9), (2, "b2", 2), (4, "d2", 4)]


def test_delete_older_than_refuses_a_bad_sequence(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    table.connection().append([{"id": 1, "name": "a", "salary": 1, "_CHANGE_TYPE": "UPSERT"}])
    with pytest.raises(InvalidArgument, match="'2x/0'"):
        table.delete_older_than("2x/0")
    assert rows(table) == [(1, "a", 1)]


def test_applied_pending_files_leave_the_process_cache(tmp_path: Path):
    """Goal 6 of issue 11: the cache of pending files' rows must not keep files an apply has
    consumed; a long run would otherwise grow until the cache's row bound."""
    from cdcflow.table.apply import PENDING_FILES

    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    folder = str((tmp_path / "t" / "_cdcflow" / "pending").resolve()) + "/"

    def cached() -> list[str]:
        return [key[0] for key in PENDING_FILES._tables if key[0].startswith(folder)]

    for round_ in range(3):
        table.connection().append([{"id": i, "name": f"n{round_}", "salary": round_,
                                    "_CHANGE_TYPE": "UPSERT"} for i in range(5)])
        table.apply()
    table.connection().append([{"id": 9, "name": "x", "salary": 9, "_CHANGE_TYPE": "UPSERT"}])
    assert rows(table)[-1] == (9, "x", 9)  # a runtime merge reads the one unapplied file
    assert len(cached()) == 1
    table.apply()
    table.connection().append([{"id": 8, "name": "y", "salary": 8, "_CHANGE_TYPE": "UPSERT"}])
    assert (8, "y", 8) in rows(table)
    assert len(cached()) == 1
