"""Events (EV-2..EV-7): the seed's INSERT/UPDATE/DELETE example, Avro and JSON round trips of
every column type with NULLs, deterministic uuids and dedup on redelivery, schema keys."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from cdcflow import Database
from cdcflow.events.avro_format import avro_schema, read_avro, write_avro
from cdcflow.model.events import (
    EMBEDDED_CDC,
    drop_duplicates,
    event_from_mod,
    row_of_mod,
    schema_key,
)

pytestmark = pytest.mark.unit
READ_AT = datetime(2026, 11, 21, 7, 37, 16, 808000, tzinfo=UTC)


def events_of(db: Database, stream: str) -> list:
    start = db.partitions(stream)[0].start_timestamp
    end = db.current_timestamp()
    out, rows = [], {}
    (first,) = db.read_change_stream(stream, start, end, None, 1000)
    for child in first.child_partitions_record.child_partitions:
        for change in db.read_change_stream(stream, start, end, child.token, 1000):
            record = change.data_change_record
            if record is None:
                continue
            for index, mod in enumerate(record.mods):
                key = json.dumps(mod.keys)
                rows[key] = row_of_mod(record, index, rows.get(key))
                out.append(event_from_mod("projects/p/streams/s", "shop.db", record, index,
                                          rows[key], READ_AT, child.token))
    return out


SAMPLE = ("CREATE TABLE SAMPLE (THIS_IS_MY_PK INT64 NOT NULL, FIELD1 STRING(MAX), "
          "FIELD2 STRING(MAX) NOT NULL) PRIMARY KEY (THIS_IS_MY_PK)")


@pytest.mark.parametrize("capture", ["OLD_AND_NEW_VALUES", "NEW_VALUES", "NEW_ROW",
                                     "NEW_ROW_AND_OLD_VALUES"])
def test_seed_example_insert_update_delete(db: Database, capture: str):
    """EV-1: each event is one change of one object (`object`) of one stream
    (`stream_name`); EV-5's payloads of the seed's example."""
    db.ddl(SAMPLE)
    db.ddl(f"CREATE CHANGE STREAM S FOR ALL OPTIONS (value_capture_type = '{capture}')")
    with db.transaction() as tx:
        tx.insert("SAMPLE", {"THIS_IS_MY_PK": 1231535353, "FIELD1": "foo", "FIELD2": "TLV"})
    with db.transaction() as tx:
        tx.update("SAMPLE", {"THIS_IS_MY_PK": 1231535353, "FIELD1": None})
    with db.transaction() as tx:
        tx.delete("SAMPLE", {"THIS_IS_MY_PK": 1231535353})
    insert, update, delete = [e.to_json() for e in events_of(db, "S")]
    row = {"THIS_IS_MY_PK": "1231535353", "FIELD1": "foo", "FIELD2": "TLV"}
    assert insert["payload"] == row
    assert update["payload"] == row | {"FIELD1": None}  # the whole new row, no old values
    assert delete["payload"] == row | {"FIELD1": None}  # the deleted row
    assert [e["source_metadata"]["change_type"] for e in (insert, update, delete)] == [
        "INSERT", "UPDATE", "DELETE"]
    assert [e["source_metadata"]["is_deleted"] for e in (insert, update, delete)] == [
        False, False, True]
    for event in (insert, update, delete):
        assert event["read_method"] == EMBEDDED_CDC and event["object"] == "SAMPLE"
        assert event["stream_name"] == "projects/p/streams/s"
        assert event["read_timestamp"] == "2026-11-21T07:37:16.808Z"
        assert event["source_timestamp"].endswith("Z")
        assert event["source_metadata"]["primary_keys"] == ["THIS_IS_MY_PK"]
        assert set(event) == {"stream_name", "read_method", "object", "schema_key", "uuid",
                              "read_timestamp", "source_timestamp", "sort_keys",
                              "source_metadata", "payload"}
    keys = [tuple(e["sort_keys"]) for e in (update, delete, insert)]
    assert sorted(keys) == [tuple(insert["sort_keys"]), tuple(update["sort_keys"]),
                            tuple(delete["sort_keys"])]  # sort_keys restore the order (EV-6)


def test_uuid_is_stable_across_redelivery_and_dedup_drops_copies(db: Database):
    db.ddl(SAMPLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for pk in range(5):
        with db.transaction() as tx:
            tx.insert("SAMPLE", {"THIS_IS_MY_PK": pk, "FIELD2": "x"})
    first = events_of(db, "S")
    again = events_of(db, "S")  # a redelivery reads the same changes again
    assert [e.uuid for e in first] == [e.uuid for e in again]
    assert len({e.uuid for e in first}) == 5
    seen: set[str] = set()
    assert len(drop_duplicates(first[:3], seen)) == 3
    assert drop_duplicates(first + again, seen) == first[3:]


TYPED = ("CREATE TABLE T (K INT64 NOT NULL, F FLOAT64, B BOOL, S STRING(MAX), Y BYTES(MAX), "
         "D DATE, TS TIMESTAMP, N NUMERIC, J JSON, A ARRAY<INT64>, SA ARRAY<STRING(MAX)>) "
         "PRIMARY KEY (K)")


def test_avro_and_json_round_trip_every_type_and_nulls(db: Database):
    db.ddl(TYPED)
    db.ddl("CREATE CHANGE STREAM S FOR ALL OPTIONS (value_capture_type = 'NEW_ROW')")
    full = {"K": 1, "F": 1.5, "B": True, "S": "héllo", "Y": b"\x00\xff", "D": date(2024, 2, 29),
            "TS": datetime(2022, 9, 27, 12, 30, 0, 123456, tzinfo=UTC),
            "N": Decimal("-123.456000001"), "J": {"a": [1, None, "x"]}, "A": [1, None, 3],
            "SA": ["x", None]}
    with db.transaction() as tx:
        tx.insert("T", full)
        tx.insert("T", {"K": 2})
    events = sorted(events_of(db, "S"), key=lambda e: e.payload["K"])
    buffer = io.BytesIO()
    write_avro(buffer, events)
    buffer.seek(0)
    back = list(read_avro(buffer))
    assert [e.payload for e in back] == [full, {k: None for k in full} | {"K": 2}]
    assert [e.uuid for e in back] == [e.uuid for e in events]
    assert back[0].source_metadata == events[0].source_metadata
    assert back[0].sort_keys == events[0].sort_keys
    assert back[0].column_types == events[0].column_types
    text = json.loads(json.dumps(events[0].to_json()))
    assert text["payload"]["Y"] == "AP8=" and text["payload"]["N"] == "-123.456000001"
    assert text["payload"]["K"] == "1" and text["payload"]["A"] == ["1", None, "3"]
    assert text["payload"]["TS"] == "2022-09-27T12:30:00.123456Z"
    schema = avro_schema("T", events[0].column_types)
    payload_fields = schema["fields"][-1]["type"]["fields"]
    assert [f["name"] for f in payload_fields] == list(full)  # values by column position


def test_schema_key_changes_with_the_schema(db: Database):
    db.ddl(SAMPLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL OPTIONS (value_capture_type = 'NEW_ROW')")
    with db.transaction() as tx:
        tx.insert("SAMPLE", {"THIS_IS_MY_PK": 1, "FIELD2": "x"})
    db.ddl("ALTER TABLE SAMPLE ADD COLUMN FIELD3 INT64")
    with db.transaction() as tx:
        tx.insert("SAMPLE", {"THIS_IS_MY_PK": 2, "FIELD2": "y"})
    one, two = sorted(events_of(db, "S"), key=lambda e: e.payload["THIS_IS_MY_PK"])
    assert one.schema_key != two.schema_key
    assert one.schema_key == schema_key("SAMPLE", one.column_types)
    buffer = io.BytesIO()
    with pytest.raises(Exception, match="one Avro file holds one schema"):
        write_avro(buffer, [one, two])
