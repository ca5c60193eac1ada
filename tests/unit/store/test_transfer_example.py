"""CS-7: the seed's transfer example, two accounts in two partitions, one transaction."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cdcflow import COMMIT_TIMESTAMP, ChangeRecord, Database
from cdcflow.errors import InvalidArgument
from tests.conftest import ACCOUNT_BALANCE

pytestmark = pytest.mark.unit


def _read_all(db: Database, stream: str, start: datetime) -> list[tuple[str, ChangeRecord]]:
    end = db.current_timestamp()
    out = []
    (first,) = db.read_change_stream(stream, start, end, None, 1000)
    assert first.child_partitions_record is not None
    tokens = [c.token for c in first.child_partitions_record.child_partitions]
    for token in tokens:
        for row in db.read_change_stream(stream, start, end, token, 1000):
            out.append((token, row))
    return out


def test_transfer_between_two_partitions_is_one_transaction_with_two_records(db: Database):
    db.ddl(ACCOUNT_BALANCE)
    db.ddl(
        "CREATE CHANGE STREAM Transfers FOR AccountBalance "
        "OPTIONS (retention_period = '7d', value_capture_type = 'OLD_AND_NEW_VALUES')"
    )
    old_update = datetime(2022, 9, 26, 11, 28, 0, 189413, tzinfo=UTC)
    with db.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "Id1", "Balance": 1500, "LastUpdate": old_update})
        tx.insert("AccountBalance", {"AccountId": "Id2", "Balance": 1500, "LastUpdate": old_update})
    (partition,) = db.partitions("Transfers")
    h1 = db.key_hash("AccountBalance", "Id1")
    h2 = db.key_hash("AccountBalance", "Id2")
    db.split_partition("Transfers", partition.token, at=(h1 + h2) // 2 + 1)
    assert db.partition_of("Transfers", "AccountBalance", "Id1") != db.partition_of(
        "Transfers", "AccountBalance", "Id2"
    )
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.update("AccountBalance", {"AccountId": "Id1", "Balance": 1000,
                                     "LastUpdate": COMMIT_TIMESTAMP})
        tx.update("AccountBalance", {"AccountId": "Id2", "Balance": 2000,
                                     "LastUpdate": COMMIT_TIMESTAMP})
    records = [
        (token, row.data_change_record)
        for token, row in _read_all(db, "Transfers", start)
        if row.data_change_record is not None
    ]
    assert len(records) == 2
    assert len({token for token, _ in records}) == 2
    by_key = {r.mods[0].keys["AccountId"]: r for _, r in records}
    one, two = by_key["Id1"], by_key["Id2"]
    assert one.server_transaction_id == two.server_transaction_id
    assert one.commit_timestamp == two.commit_timestamp == tx.commit_timestamp
    assert sorted([one.record_sequence, two.record_sequence]) == ["00000000", "00000001"]
    for record in (one, two):
        assert record.number_of_records_in_transaction == 2
        assert record.number_of_partitions_in_transaction == 2
        assert record.is_last_record_in_transaction_in_partition
        assert record.mod_type == "UPDATE"
        assert record.table_name == "AccountBalance"
        assert record.value_capture_type == "OLD_AND_NEW_VALUES"
    stamp = tx.commit_timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert one.to_dict()["mods"] == [
        {
            "keys": {"AccountId": "Id1"},
            "new_values": {"LastUpdate": stamp, "Balance": 1000},
            "old_values": {"LastUpdate": "2022-09-26T11:28:00.189413Z", "Balance": 1500},
        }
    ]
    assert two.to_dict()["mods"][0]["new_values"]["Balance"] == 2000
    assert two.to_dict()["mods"][0]["old_values"]["Balance"] == 1500
    assert one.to_dict()["column_types"] == [
        {"name": "AccountId", "type": {"code": "STRING"}, "is_primary_key": True,
         "ordinal_position": 1},
        {"name": "LastUpdate", "type": {"code": "TIMESTAMP"}, "is_primary_key": False,
         "ordinal_position": 2},
        {"name": "Balance", "type": {"code": "INT64"}, "is_primary_key": False,
         "ordinal_position": 3},
    ]
    assert db.read_row("AccountBalance", "Id2")["Balance"] == 2000


def test_record_dict_shape_round_trips(db: Database):
    """CS-6 (and CS-7's dict shape): a ChangeRecord row holding a data_change_record has
    its heartbeat_record and child_partitions_record empty."""
    db.ddl(ACCOUNT_BALANCE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "a", "Balance": 1})
    rows = [r for _, r in _read_all(db, "S", start)]
    (record,) = [r.data_change_record for r in rows if r.data_change_record]
    data = record.to_dict()
    assert data["commit_timestamp"].endswith("Z") and len(data["commit_timestamp"]) == 27
    from cdcflow import DataChangeRecord

    assert DataChangeRecord.from_dict(data) == record
    wrapped = ChangeRecord(data_change_record=record).to_dict()
    assert wrapped["heartbeat_record"] == [] and wrapped["child_partitions_record"] == []
    assert wrapped["data_change_record"] == [data]


def test_every_row_holds_exactly_one_kind_of_record(fake_db: Database):
    """CS-6: each row of a change-stream query holds exactly one of data_change_record,
    heartbeat_record and child_partitions_record, the other two empty; a ChangeRecord with
    none or two of them is refused."""
    db = fake_db
    db.ddl(ACCOUNT_BALANCE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    with db.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "a", "Balance": 1})
    (first,) = db.read_change_stream("S", root.start_timestamp, db.current_timestamp(), None,
                                     1000)
    rows = db.read_change_stream("S", root.start_timestamp, None, root.token, 1000)
    seen = [first, next(rows), next(rows)]  # the data, then a heartbeat (the clock moves)
    db.split_partition("S", root.token)
    seen += list(rows)  # the query ends with the child partitions
    kinds = []
    for row in seen:
        shape = row.to_dict()
        filled = [name for name, value in shape.items() if value]
        assert len(filled) == 1 and len(shape[filled[0]]) == 1, shape
        assert [name for name in shape if getattr(row, name) is not None] == filled
        kinds.append(filled[0])
    assert set(kinds) == {"data_change_record", "heartbeat_record", "child_partitions_record"}
    beat = next(r.heartbeat_record for r in seen if r.heartbeat_record)
    with pytest.raises(InvalidArgument, match="exactly one record, got 0"):
        ChangeRecord()
    with pytest.raises(InvalidArgument, match="exactly one record, got 2"):
        ChangeRecord(heartbeat_record=beat,
                     child_partitions_record=first.child_partitions_record)
