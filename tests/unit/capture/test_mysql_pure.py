"""The MySQL source's pure parts (issue 12): GTID state, the server checks' verdicts, type
mapping and value conversion, and row events into changes (EV-4's key moves)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest

from cdcflow.capture.mysql.checks import missing_privileges, missing_settings
from cdcflow.capture.mysql.position import GtidState, MySqlGtidSet, after_group
from cdcflow.capture.mysql.rebackfill import file_order
from cdcflow.capture.mysql.rows import binlog_column, shape_of
from cdcflow.capture.mysql.types import MySqlColumn, converter, unified_type
from cdcflow.errors import InvalidArgument, TypeMismatch

pytestmark = pytest.mark.unit


def test_gtid_state_keeps_the_newest_gtid_per_domain():
    state = GtidState.parse("1-7-40, 0-1-42")
    assert state.text() == "0-1-42,1-7-40"
    assert state.advanced("0-1-43").advanced("2-9-1").text() == "0-1-43,1-7-40,2-9-1"
    assert GtidState.parse("").advanced("0-1-1").text() == "0-1-1"
    with pytest.raises(InvalidArgument, match="'0-1' is not domain-server-sequence"):
        GtidState.parse("0-1")


A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4D2B3F10-0000-11E1-9E33-C80AA9429562"


def test_mysql_gtid_sets_merge_intervals_and_answer_containment():
    gtids = MySqlGtidSet.parse(f"{A}:1-5:7, {B}:1-3")
    assert gtids.text() == f"{A}:1-5:7,{B.lower()}:1-3"
    assert gtids.added(f"{A}:6").text() == f"{A}:1-7,{B.lower()}:1-3"
    assert after_group(gtids, f"{A}:8").text() == f"{A}:1-5:7-8,{B.lower()}:1-3"
    assert after_group(gtids, "ANONYMOUS") == after_group(gtids, f"{A}:0") == gtids
    assert gtids.contains(MySqlGtidSet.parse(f"{A}:2-4:7"))
    assert gtids.contains(MySqlGtidSet.parse(""))
    assert not gtids.contains(MySqlGtidSet.parse(f"{A}:1-6"))  # 6 was purged, never read
    assert not gtids.contains(MySqlGtidSet.parse(f"{A}:1-5,{B}:4"))
    assert not MySqlGtidSet.parse("").contains(gtids)
    with pytest.raises(InvalidArgument, match="'nope:1' is not uuid"):
        MySqlGtidSet.parse("nope:1")


def test_binlog_positions_order_by_file_number_then_offset():
    assert file_order("mariadb-bin.000010", 4) > file_order("mariadb-bin.000009", 99_999)
    assert file_order("mariadb-bin.000002", 120) < file_order("mariadb-bin.000002", 121)


def test_missing_settings_name_each_variable_and_its_fix():
    good = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL", "server_id": "1"}
    assert missing_settings(good) == []
    assert missing_settings(good | {"binlog_format": "MIXED", "server_id": "0"}) == [
        "binlog_format=MIXED; needs ROW (SET GLOBAL binlog_format = 'ROW')",
        "server_id=0; a binlog source needs a non-zero server_id"]
    older = {k: v for k, v in good.items() if k != "binlog_row_metadata"}
    assert missing_settings(older) == []  # a server without the variable
    assert missing_settings(good | {"log_bin": "OFF"})[0].startswith("log_bin=OFF; needs ON")


def test_missing_privileges_read_grants_on_star_dot_star_only():
    assert missing_privileges(["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%`"]) \
        == []
    assert missing_privileges(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`"]) == []
    problems = missing_privileges(["GRANT USAGE ON *.* TO `w`@`%`",
                                   "GRANT REPLICATION SLAVE ON `shop`.* TO `w`@`%`"])
    assert len(problems) == 2 and "REPLICATION SLAVE" in problems[0]


@pytest.mark.parametrize(("column", "ddl"), [
    (MySqlColumn("a", "bigint", "bigint(20) unsigned"), "NUMERIC(20, 0)"),
    (MySqlColumn("a", "bigint", "bigint(20)"), "INT64"),
    (MySqlColumn("a", "int", "int(10) unsigned"), "INT64"),
    (MySqlColumn("a", "decimal", "decimal(65,30)", 65, 30), "STRING(MAX)"),
    (MySqlColumn("a", "decimal", "decimal(10,2)", 10, 2), "NUMERIC(10, 2)"),
    (MySqlColumn("a", "bit", "bit(64)", 64), "NUMERIC(20, 0)"),
    (MySqlColumn("a", "varbinary", "varbinary(8)"), "BYTES(MAX)"),
    (MySqlColumn("a", "time", "time(6)"), "STRING(MAX)"),
])
def test_unified_types(column: MySqlColumn, ddl: str):
    assert unified_type(column).ddl() == ddl


def test_values_convert_the_same_from_either_reader():
    unsigned = MySqlColumn("u", "bigint", "bigint unsigned")
    assert converter(unsigned, unified_type(unsigned))(2**64 - 1) == "18446744073709551615"
    flags = MySqlColumn("s", "set", "set('x','it''s','a')")
    to_set = converter(flags, unified_type(flags))
    assert to_set({"a", "x"}) == to_set("a,x") == "x,a"  # definition order, both readers
    bits = MySqlColumn("b", "bit", "bit(10)", 10)
    assert converter(bits, unified_type(bits))("1010101010") == \
        converter(bits, unified_type(bits))(b"\x02\xaa") == 682
    clock = MySqlColumn("t", "time", "time(6)")
    assert converter(clock, unified_type(clock))(timedelta(hours=-1, microseconds=5)) == \
        "-00:59:59.999995"
    stamp = MySqlColumn("d", "datetime", "datetime(6)")
    naive = datetime(2024, 4, 30, 11, 19, 44, 123456, tzinfo=UTC).replace(tzinfo=None)
    assert converter(stamp, unified_type(stamp))(naive) \
        == converter(stamp, unified_type(stamp))(
            datetime(2024, 4, 30, 11, 19, 44, 123456, tzinfo=UTC))
    money = MySqlColumn("m", "decimal", "decimal(4,2)", 4, 2)
    with pytest.raises(TypeMismatch):
        converter(money, unified_type(money))(Decimal("123.45"))


def _column(name: str, code: int, **extra: object) -> SimpleNamespace:
    fields: dict[str, object] = {"name": name, "type": code, "unsigned": False,
                                 "enum_values": None, "set_values": None,
                                 "character_set_name": "utf8mb4"}
    return SimpleNamespace(**(fields | extra))


def test_an_update_that_moves_the_key_is_a_delete_then_an_insert():
    shape = shape_of("shop.orders", [_column("id", 3), _column("item", 15)], "id")
    before, after = {"id": 3, "item": "cap"}, {"id": 30, "item": "cap"}
    moved = shape.changes("UpdateRowsEvent", {"before_values": before, "after_values": after},
                          {"log_file": "b.000001", "log_position": 99, "row": 0})
    assert [(c.mod_type, c.keys) for c in moved] == [("DELETE", {"id": 3}),
                                                      ("INSERT", {"id": 30})]
    assert moved[0].position["moved_to"] == {"id": 30}
    assert moved[1].position["moved_from"] == {"id": 3} and moved[1].position["part"] == 1
    same = shape.changes("UpdateRowsEvent", {"before_values": before,
                                             "after_values": before | {"item": "lid"}}, {})
    assert [(c.mod_type, c.new_values) for c in same] == [("UPDATE", {"item": "lid"})]
    with pytest.raises(InvalidArgument, match="lacks column 'item'"):
        shape.changes("WriteRowsEvent", {"values": {"id": 1}}, {})


def test_binlog_columns_read_binary_strings_and_enums_from_the_table_map():
    assert binlog_column(_column("b", 15, character_set_name=None)).data_type == "varbinary"
    assert binlog_column(_column("t", 252)).data_type == "text"
    enum = binlog_column(_column("e", 254, enum_values=["", "small", "it's"]))
    assert enum.members() == ("small", "it's")
    with pytest.raises(InvalidArgument, match="binlog type 6"):
        binlog_column(_column("n", 6))
