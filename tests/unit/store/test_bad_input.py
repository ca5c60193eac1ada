"""Bad arguments and bad DDL give typed errors naming the value and rule; nothing is written."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.errors import (
    AlreadyExists,
    DdlError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotNullViolation,
    TypeMismatch,
)
from tests.conftest import ACCOUNT_BALANCE

pytestmark = pytest.mark.unit

TYPED = (
    "CREATE TABLE T (K INT64 NOT NULL, S STRING(5), B BYTES(3), F FLOAT64, D DATE, "
    "N NUMERIC, J JSON, A ARRAY<INT64>, Flag BOOL, TS TIMESTAMP, Req STRING(MAX) NOT NULL) "
    "PRIMARY KEY (K)"
)


@pytest.fixture
def ready(db: Database) -> Database:
    db.ddl(ACCOUNT_BALANCE)
    db.ddl(TYPED)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    with db.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "exists", "Balance": 1})
    return db


def _state(db: Database) -> tuple[object, ...]:
    conn = db._session().conn
    log = conn.execute("SELECT COUNT(*) FROM _log").fetchone()[0]
    meta = conn.execute("SELECT value FROM _meta WHERE key='txn_counter'").fetchone()[0]
    return (db.scan("AccountBalance"), db.scan("T"), log, meta, db.tables(), db.change_streams())


BAD_WRITES = [
    ("insert", "T", {"K": "1", "Req": "r"}, TypeMismatch, "'1'"),
    ("insert", "T", {"K": True, "Req": "r"}, TypeMismatch, "True"),
    ("insert", "T", {"K": 2**63, "Req": "r"}, TypeMismatch, "2^63"),
    ("insert", "T", {"K": 1, "Req": "r", "S": "toolong"}, TypeMismatch, "exceed the limit 5"),
    ("insert", "T", {"K": 1, "Req": "r", "B": b"four"}, TypeMismatch, "exceed the limit 3"),
    ("insert", "T", {"K": 1, "Req": "r", "F": "1.0"}, TypeMismatch, "FLOAT64"),
    ("insert", "T", {"K": 1, "Req": "r", "D": datetime.now(UTC)}, TypeMismatch, "DATE"),
    ("insert", "T", {"K": 1, "Req": "r", "N": Decimal("1.0000000001")}, TypeMismatch, "9 frac"),
    ("insert", "T", {"K": 1, "Req": "r", "N": "abc"}, TypeMismatch, "'abc'"),
    ("insert", "T", {"K": 1, "Req": "r", "J": {1, 2}}, TypeMismatch, "JSON"),
    ("insert", "T", {"K": 1, "Req": "r", "A": [1, "x"]}, TypeMismatch, "'x'"),
    ("insert", "T", {"K": 1, "Req": "r", "Flag": 1}, TypeMismatch, "BOOL"),
    ("insert", "T", {"K": 1, "Req": "r", "TS": datetime(2020, 1, 1)},  # noqa: DTZ001 naive
     TypeMismatch, "timezone"),
    ("insert", "T", {"K": 1, "Req": "r", "TS": COMMIT_TIMESTAMP}, InvalidArgument,
     "allow_commit_timestamp"),
    ("insert", "T", {"K": 1}, NotNullViolation, "Req"),
    ("insert", "T", {"K": 1, "Req": None}, NotNullViolation, "Req"),
    ("insert", "T", {"Req": "r"}, InvalidArgument, "primary key"),
    ("insert", "T", {"K": 1, "Req": "r", "Nope": 1}, NotFound, "'Nope'"),
    ("insert", "Missing", {"K": 1}, NotFound, "'Missing'"),
    ("delete", "T", {"K": 1, "Req": "r"}, InvalidArgument, "only key columns"),
]


@pytest.mark.parametrize(("kind", "table", "values", "error", "needle"), BAD_WRITES)
def test_bad_mutation_raises_typed_error_and_writes_nothing(
    ready: Database, kind: str, table: str, values: dict, error: type, needle: str
):
    before = _state(ready)
    with pytest.raises(error, match=None) as caught, ready.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "other", "Balance": 5})
        getattr(tx, kind)(table, values)
    assert needle in str(caught.value)
    assert _state(ready) == before


COMMIT_FAILURES = [
    ("insert", {"AccountId": "exists", "Balance": 2}, AlreadyExists, "exists already"),
    ("update", {"AccountId": "ghost", "Balance": 2}, NotFound, "ghost"),
    ("delete", {"AccountId": "ghost"}, NotFound, "ghost"),
]


@pytest.mark.parametrize(("kind", "values", "error", "needle"), COMMIT_FAILURES)
def test_row_existence_errors_at_commit_roll_back_everything(
    ready: Database, kind: str, values: dict, error: type, needle: str
):
    before = _state(ready)
    with pytest.raises(error) as caught, ready.transaction() as tx:
        tx.insert("AccountBalance", {"AccountId": "fresh", "Balance": 5})
        getattr(tx, kind)("AccountBalance", values)
    assert needle in str(caught.value)
    assert _state(ready) == before
    assert ready.read_row("AccountBalance", "fresh") is None


BAD_DDL = [
    ("CREATE TABLE X (A INT64) PRIMARY KEY (B)", DdlError, "'B'"),
    ("CREATE TABLE X (A INT32) PRIMARY KEY (A)", DdlError, "INT32"),
    ("CREATE TABLE X (A INT64, A INT64) PRIMARY KEY (A)", DdlError, "twice"),
    ("CREATE TABLE X (A STRING(0)) PRIMARY KEY (A)", DdlError, "'0'"),
    ("CREATE TABLE X (A INT64)", DdlError, "PRIMARY"),
    ("CREATE TABLE X (A JSON) PRIMARY KEY (A)", DdlError, "key column"),
    ("CREATE TABLE X (A INT64 OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (A)",
     DdlError, "TIMESTAMP"),
    ("CREATE TABLE AccountBalance (A INT64) PRIMARY KEY (A)", AlreadyExists, "AccountBalance"),
    ("CREATE TABLE __x (A INT64) PRIMARY KEY (A)", DdlError, "reserved"),
    ("CREATE TABLE X (" + ", ".join(f"C{i} INT64" for i in range(17)) + ") PRIMARY KEY ("
     + ", ".join(f"C{i}" for i in range(17)) + ")", DdlError, "17 primary key"),
    ("DROP TABLE Missing", NotFound, "'Missing'"),
    ("ALTER TABLE T ADD COLUMN S INT64", AlreadyExists, "'S'"),
    ("ALTER TABLE T ADD COLUMN Z INT64 NOT NULL", DdlError, "NOT NULL"),
    ("SELECT 1", DdlError, "CREATE TABLE"),
    ("", DdlError, "empty"),
    ("CREATE CHANGE STREAM Everything FOR ALL", AlreadyExists, "Everything"),
    ("CREATE CHANGE STREAM S2 FOR Missing", NotFound, "'Missing'"),
    ("CREATE CHANGE STREAM S2 FOR T(Nope)", NotFound, "'Nope'"),
    ("CREATE CHANGE STREAM S2 FOR T(K)", DdlError, "key column"),
    ("CREATE CHANGE STREAM S2 FOR ALL OPTIONS (retention_period = '30m')", InvalidArgument,
     "1 hour to 30 days"),
    ("CREATE CHANGE STREAM S2 FOR ALL OPTIONS (retention_period = '31d')", InvalidArgument,
     "'31d'"),
    ("CREATE CHANGE STREAM S2 FOR ALL OPTIONS (retention_period = 'soon')", DdlError, "'soon'"),
    ("CREATE CHANGE STREAM S2 FOR ALL OPTIONS (value_capture_type = 'ALL')", InvalidArgument,
     "'ALL'"),
    ("CREATE CHANGE STREAM S2 FOR ALL OPTIONS (colour = 'red')", DdlError, "colour"),
    ("ALTER CHANGE STREAM Missing SET FOR ALL", NotFound, "'Missing'"),
    ("ALTER CHANGE STREAM Everything SET SOMETHING", DdlError, "OPTIONS"),
    ("DROP CHANGE STREAM Missing", NotFound, "'Missing'"),
    ("CREATE TABLE X (A INT64) PRIMARY KEY (A) extra", DdlError, "'extra'"),
]


@pytest.mark.parametrize(("ddl", "error", "needle"), BAD_DDL)
def test_bad_ddl_raises_typed_error_and_changes_nothing(
    ready: Database, ddl: str, error: type, needle: str
):
    before = _state(ready)
    schema_before = ready.table_schema("T")
    with pytest.raises(error) as caught:
        ready.ddl(ddl)
    assert needle in str(caught.value)
    assert _state(ready) == before
    assert ready.table_schema("T") == schema_before


def test_drop_table_watched_explicitly_is_refused(ready: Database):
    ready.ddl("CREATE CHANGE STREAM Explicit FOR T")
    with pytest.raises(FailedPrecondition, match="Explicit"):
        ready.ddl("DROP TABLE T")
    assert "T" in ready.tables()


def _t0(db: Database) -> datetime:
    return db.current_timestamp()


QUERY_CASES = [
    (dict(heartbeat_milliseconds=999), InvalidArgument, "1000..300000"),
    (dict(heartbeat_milliseconds=300_001), InvalidArgument, "300001"),
    (dict(start_offset=timedelta(hours=1)), InvalidArgument, "in the future"),
    (dict(start_offset=-timedelta(days=1)), InvalidArgument, "before the creation"),
    (dict(end_offset=-timedelta(seconds=1)), InvalidArgument, "before start_timestamp"),
    (dict(partition_token="nope"), NotFound, "'nope'"),
    (dict(stream="Nope"), NotFound, "'Nope'"),
]


@pytest.mark.parametrize(("case", "error", "needle"), QUERY_CASES)
def test_bad_change_stream_arguments(ready: Database, case: dict, error: type, needle: str):
    t0 = _t0(ready)
    start = t0 + case.get("start_offset", timedelta(0))
    end = t0 + case["end_offset"] if "end_offset" in case else None
    with pytest.raises(error) as caught:
        ready.read_change_stream(
            case.get("stream", "Everything"), start, end, case.get("partition_token"),
            case.get("heartbeat_milliseconds", 1000),
        )
    assert needle in str(caught.value)


SQL_CASES = [
    ("SELECT * FROM Everything", {}, "not a change stream query"),
    ("SELECT ChangeRecord FROM READ_Everything(end_timestamp => NULL, "
     "heartbeat_milliseconds => 1000)", {}, "start_timestamp is required"),
    ("SELECT ChangeRecord FROM READ_Everything(start_timestamp => @s)", {"s": "x"},
     "heartbeat_milliseconds is required"),
    ("SELECT ChangeRecord FROM READ_Everything(start_timestamp => @s, "
     "heartbeat_milliseconds => 1000, colour => 'red')", {}, "unknown argument 'colour'"),
    ("SELECT ChangeRecord FROM READ_Everything(start_timestamp => @missing, "
     "heartbeat_milliseconds => 1000)", {}, "@missing"),
    ("SELECT ChangeRecord FROM READ_Everything(start_timestamp => 'yesterday', "
     "heartbeat_milliseconds => 1000)", {}, "'yesterday'"),
    ("SELECT ChangeRecord FROM READ_Everything(start_timestamp => @s, "
     "heartbeat_milliseconds => 'often')", {}, "'often'"),
]


@pytest.mark.parametrize(("sql", "params", "needle"), SQL_CASES)
def test_bad_sql_form_is_rejected(ready: Database, sql: str, params: dict, needle: str):
    params = params | ({"s": _t0(ready)} if "s" not in params else {})
    with pytest.raises(InvalidArgument) as caught:
        list(ready.execute_sql(sql, params=params))
    assert needle in str(caught.value)


def test_only_single_use_strong_reads_are_valid(ready: Database):
    with pytest.raises(InvalidArgument, match="CS-10"):
        ready.execute_sql(
            "SELECT ChangeRecord FROM READ_Everything(start_timestamp => @s, "
            "heartbeat_milliseconds => 1000)", {"s": _t0(ready)}, transaction="read_write"
        )


def test_good_values_of_every_type_round_trip(ready: Database):
    row = {
        "K": 7, "S": "héllo", "B": b"\x00\xff", "F": float("nan"), "D": date(2024, 2, 29),
        "N": Decimal("-12345678901234567890123456789.123456789"), "J": {"a": [1, None]},
        "A": [1, None, 3], "Flag": False, "TS": datetime(2022, 9, 27, 12, 30, tzinfo=UTC),
        "Req": "r",
    }
    with ready.transaction() as tx:
        tx.insert("T", row)
    got = ready.read_row("T", 7)
    assert got is not None
    assert math.isnan(got.pop("F"))
    expected = {k: v for k, v in row.items() if k != "F"}
    assert got == expected
