"""The MySQL source against a real MariaDB (issue 12): the server checks, discovery, types
read the same way by the backfill and the binlog, exact resume after a restart, and a purged
binlog detected before reading."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.source import MySqlConfig, MySqlSource, PositionLost
from cdcflow.errors import FailedPrecondition
from cdcflow.localmaria import LocalMariaDB
from cdcflow.store.changelog import ChangeLog

pytestmark = pytest.mark.integration
ENV = "CDCFLOW_TEST_MYSQL_PASSWORD"


def source_of(maria: LocalMariaDB, tmp_path: Path, user: str = "cdc",
              include: tuple[str, ...] = ("*",)) -> MySqlSource:
    return MySqlSource(MySqlConfig(Endpoint("127.0.0.1", maria.port, user, ENV), ("shop",),
                                   4242, str(tmp_path / "log.db"), include))


def test_the_server_check_names_every_missing_setting_and_privilege(maria: LocalMariaDB,
                                                                    tmp_path: Path):
    maria.sql(f"CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY '{maria.password}'",
              "GRANT SELECT ON shop.* TO 'weak'@'127.0.0.1'")
    maria.sql("SET GLOBAL binlog_format = 'MIXED'", "SET GLOBAL binlog_row_image = 'MINIMAL'",
              "SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        with pytest.raises(FailedPrecondition) as raised:
            source_of(maria, tmp_path, "weak").check()
    finally:
        maria.sql("SET GLOBAL binlog_format = 'ROW'", "SET GLOBAL binlog_row_image = 'FULL'",
                  "SET GLOBAL binlog_row_metadata = 'FULL'")
    message = str(raised.value)
    for needed in ("binlog_format=MIXED; needs ROW", "binlog_row_image=MINIMAL; needs FULL",
                   "binlog_row_metadata=MINIMAL; needs FULL", "REPLICATION SLAVE",
                   "REPLICATION CLIENT"):
        assert needed in message
    assert maria.password not in message
    assert source_of(maria, tmp_path).check()["binlog_format"] == "ROW"


def test_discover_lists_database_dot_table_with_unified_types(maria: LocalMariaDB,
                                                              tmp_path: Path):
    maria.sql("CREATE TABLE discovered (a BIGINT UNSIGNED NOT NULL, b VARCHAR(10), "
              "c DECIMAL(12, 3), d DATETIME(6), PRIMARY KEY (a))", database="shop")
    found = {o.name: o for o in source_of(maria, tmp_path).discover()}
    item = found["shop.discovered"]
    assert item.primary_key == ("a",)
    assert [(c.name, c.type.ddl(), c.nullable) for c in item.columns] == [
        ("a", "NUMERIC(20, 0)", False), ("b", "STRING(MAX)", True),
        ("c", "NUMERIC(12, 3)", True), ("d", "TIMESTAMP", True)]


TYPES = """CREATE TABLE typed (
  id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT, bi BIGINT,
  bu BIGINT UNSIGNED, de DECIMAL(30, 10), fl FLOAT, db DOUBLE, dt DATE, dtm DATETIME(6),
  ts TIMESTAMP(3) NULL, tm TIME(6), yr YEAR, ch CHAR(5), vc VARCHAR(50), tx TEXT,
  bn VARBINARY(8), bl BLOB, en ENUM('small', 'large'), st SET('a', 'b', 'c'), bt BIT(10),
  js JSON)"""
ROW = ("(1, -128, 255, -32768, 8388607, -9223372036854775808, 18446744073709551615, "
       "'12345678901234567890.0123456789', 1.5, 2.25, '2024-02-29', "
       "'2024-04-30 11:19:44.123456', '2024-04-30 11:19:44.123', '812:30:05.000001', 2024, "
       "'abc', 'héllo ✓', 'long text', x'00ff10', x'0102', 'large', 'c,a', b'1010101010', "
       "'{\"k\": [1, 2]}')")


def test_each_type_reads_the_same_from_the_backfill_and_the_binlog(maria: LocalMariaDB,
                                                                   tmp_path: Path):
    maria.sql(TYPES, f"INSERT INTO typed VALUES {ROW}", database="shop")
    source = source_of(maria, tmp_path, include=("shop.typed",))
    objects = [o for o in source.discover() if o.name == "shop.typed"]
    snapshot = source.snapshot(objects, None)
    backfilled: list[dict[str, Any]] = []
    source.backfill(snapshot, objects, lambda item, rows, token: backfilled.extend(rows))
    source.release(snapshot)
    log = ChangeLog.open(str(tmp_path / "log.db"))
    with capturing(source, log):
        maria.sql(f"INSERT INTO typed VALUES {ROW.replace('(1,', '(2,', 1)}", database="shop")
        wait_for_mark(source, log)
    (streamed,) = mods_in(log)
    (row,) = backfilled
    assert row["bu"] == Decimal(2**64 - 1) and row["bi"] == -2**63  # exact above 2^63
    assert row["de"] == Decimal("12345678901234567890.0123456789")
    assert row["dtm"].isoformat() == "2024-04-30T11:19:44.123456+00:00"
    # written in the server's zone (+12:45), read as UTC by the backfill and the binlog alike
    assert row["ts"].isoformat() == "2024-04-29T22:34:44.123000+00:00"
    assert (row["tm"], row["yr"], row["vc"], row["bn"]) == ("812:30:05.000001", 2024,
                                                            "héllo ✓", b"\x00\xff\x10")
    assert (row["en"], row["st"], row["bt"]) == ("large", "a,c", 0b1010101010)
    assert row["js"] == '{"k": [1, 2]}'  # MariaDB's JSON is LONGTEXT: its text
    assert streamed["mod_type"] == "INSERT"
    decoded = decode_mod(objects[0], streamed)
    assert decoded == row | {"id": 2}


def decode_mod(item: Any, mod: dict[str, Any]) -> dict[str, Any]:
    from cdcflow.model.types import decode_value

    values = mod["keys"] | mod["new_values"]
    return {c.name: decode_value(values[c.name], c.type) for c in item.columns}


def mods_in(log: ChangeLog) -> list[dict[str, Any]]:
    """Every data change mod of the log's change stream, in commit order, as
    {"keys", "new_values", "mod_type", "position"}."""
    end = log.current_timestamp()
    found = []
    for partition in log.partitions("changes"):
        for row in log.read_change_stream("changes", partition.start_timestamp, end,
                                          partition.token, 1000):
            record = row.data_change_record
            if record is None:
                continue
            for index, mod in enumerate(record.mods):
                found.append(((record.commit_timestamp, record.record_sequence, index),
                              mod.to_dict() | {"mod_type": record.mod_type}))
    return [mod for _, mod in sorted(found, key=lambda pair: pair[0])]


class capturing:
    """A capture worker in a thread for the length of a `with` block."""

    def __init__(self, source: MySqlSource, log: ChangeLog) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=source.capture, args=(log, self.stop))

    def __enter__(self) -> capturing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def wait_for_mark(source: MySqlSource, log: ChangeLog) -> None:
    mark = source.mark()
    deadline = time.monotonic() + 60
    while not source.reached(log, mark):
        assert time.monotonic() < deadline, "the capture did not reach the mark"
        time.sleep(0.05)


def test_a_restart_resumes_exactly_and_a_purged_position_is_refused(maria: LocalMariaDB,
                                                                    tmp_path: Path):
    maria.sql("CREATE TABLE counted (id INT PRIMARY KEY, v INT)", database="shop")
    source = source_of(maria, tmp_path, include=("shop.counted",))
    objects = [o for o in source.discover() if o.name == "shop.counted"]
    source.release(source.snapshot(objects, None))
    log = ChangeLog.open(str(tmp_path / "log.db"))
    for round_ in range(3):
        with capturing(source, log):
            maria.sql(*[f"INSERT INTO counted VALUES ({round_ * 10 + i}, {i})"
                        for i in range(10)], database="shop")
            wait_for_mark(source, log)
    ids = [int(m["keys"]["id"]) for m in mods_in(log)]
    assert ids == list(range(30))  # none twice, none skipped
    maria.sql("FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
    newest = maria.sql("SHOW BINARY LOGS")[-1][0]
    stored = log.position(source.source_id)
    assert stored is not None
    deadline = time.monotonic() + 30  # a dump thread that is still ending holds its file
    while stored.position["log_file"] in source.binary_logs():
        assert time.monotonic() < deadline, "PURGE BINARY LOGS kept the stored file"
        maria.sql(f"PURGE BINARY LOGS TO '{newest}'")
        time.sleep(0.1)
    assert stored.position["log_file"] not in source.binary_logs(), (stored.position,
                                                                      source.binary_logs())
    with pytest.raises(PositionLost, match=stored.position["log_file"]):
        source.ensure_readable(log)


def test_rolled_back_work_is_not_captured_but_myisam_statements_are(maria: LocalMariaDB,
                                                                    tmp_path: Path):
    """InnoDB changes of a rolled-back transaction never reach the log. A MyISAM table is not
    transactional: the binlog holds each of its statements as a group of its own, even
    inside a transaction rolled back later, and the capture takes it as the binlog has it."""
    maria.sql("CREATE TABLE kept (id INT PRIMARY KEY) ENGINE=InnoDB",
              "CREATE TABLE plain (id INT PRIMARY KEY) ENGINE=MyISAM", database="shop")
    source = source_of(maria, tmp_path, include=("shop.kept", "shop.plain"))
    objects = [o for o in source.discover() if o.name in ("shop.kept", "shop.plain")]
    source.release(source.snapshot(objects, None))
    log = ChangeLog.open(str(tmp_path / "log.db"))
    conn = maria.connect("root", password="", database="shop")
    conn.autocommit(False)
    with capturing(source, log), conn.cursor() as cur:
        for statement in ("INSERT INTO kept VALUES (1)", "INSERT INTO plain VALUES (1)",
                          "INSERT INTO plain VALUES (2)"):
            cur.execute(statement)
        conn.rollback()
        cur.execute("INSERT INTO kept VALUES (2)")
        conn.commit()
        wait_for_mark(source, log)
    conn.close()
    captured = [(m["position"]["log_position"], m["keys"]["id"]) for m in mods_in(log)]
    assert [int(key) for _, key in captured] == [1, 2, 2], captured
    assert len({at for at, _ in captured}) == 3  # three groups: two statements, one commit


def test_threads_sharing_a_source_take_turns_on_its_connection(maria: LocalMariaDB,
                                                               tmp_path: Path):
    """A runner's threads share a stream's source (the loop's status, a drain's mark, a
    capture's checks): its one connection is used by one at a time. Sharing it at once
    failed with pymysql's "Packet sequence number wrong"."""
    source = source_of(maria, tmp_path)
    errors: list[BaseException] = []

    def use() -> None:
        try:
            for _ in range(100):
                source.mark()
                source.status()
                source.binary_logs()
        except Exception as error:
            errors.append(error)

    users = [threading.Thread(target=use) for _ in range(4)]
    for user in users:
        user.start()
    for user in users:
        user.join(120)
    assert errors == []
    source.close()
