"""Stored generated columns in the embedded database (issue 13, CW-3): the seed's computed
shard column, its Processed variant, a column added to a table that has rows, change
records that carry the computed value, and typed errors for bad definitions and writes."""

from __future__ import annotations

import pytest

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.errors import DdlError, InvalidArgument
from cdcflow.follow import follow_change_stream
from cdcflow.model.expressions import parse_expression
from cdcflow.store.changelog import open_log

pytestmark = pytest.mark.unit

SHARD = "MOD(FARM_FINGERPRINT(CONCAT(FirstName, LastName)), 19)"
SINGERS = (
    "CREATE TABLE Singers (SingerId INT64 NOT NULL, FirstName STRING(MAX), "
    "LastName STRING(MAX), Processed BOOL, "
    "LastModified TIMESTAMP OPTIONS (allow_commit_timestamp = true), "
    f"ShardId INT64 AS (CASE WHEN Processed THEN NULL ELSE {SHARD} END) STORED"
    ") PRIMARY KEY (SingerId)"
)


def shard_of(first: str | None, last: str | None) -> int | None:
    return parse_expression(SHARD).evaluate({"FirstName": first, "LastName": last})


def test_the_shard_column_follows_every_write(db: Database):
    db.ddl([SINGERS, "CREATE CHANGE STREAM All FOR ALL"])
    with db.transaction() as tx:
        tx.insert("Singers", {"SingerId": 1, "FirstName": "Alice", "LastName": "Trentor",
                              "LastModified": COMMIT_TIMESTAMP})
        tx.insert("Singers", {"SingerId": 2, "FirstName": "Bob"})
    assert db.read_row("Singers", 1)["ShardId"] == shard_of("Alice", "Trentor")
    assert db.read_row("Singers", 2)["ShardId"] is None  # CONCAT with NULL is NULL
    with db.transaction() as tx:
        tx.update("Singers", {"SingerId": 1, "LastName": "Smith"})
        tx.update("Singers", {"SingerId": 2, "LastName": "Ray"})
    assert db.read_row("Singers", 1)["ShardId"] == shard_of("Alice", "Smith")
    assert db.read_row("Singers", 2)["ShardId"] == shard_of("Bob", "Ray")
    with db.transaction() as tx:  # CW-7: processed rows leave the shard column
        tx.update("Singers", {"SingerId": 1, "Processed": True})
    assert db.read_row("Singers", 1)["ShardId"] is None
    with db.transaction() as tx:  # ... and a later update brings them back
        tx.update("Singers", {"SingerId": 1, "Processed": False, "FirstName": "Al"})
    assert db.read_row("Singers", 1)["ShardId"] == shard_of("Al", "Smith")
    log = open_log(db.path)
    records = follow_change_stream(log, "All", log.earliest_readable("All"),
                                   log.current_timestamp()).records
    shards = [m.new_values.get("ShardId") for r in records if r.table_name == "Singers"
              for m in r.mods if m.keys.get("SingerId") == 1]
    assert shards == [shard_of("Alice", "Trentor"), shard_of("Alice", "Smith"), None,
                      shard_of("Al", "Smith")]  # an update records the value it moved to


def test_a_generated_column_added_later_fills_every_version(db: Database):
    db.ddl("CREATE TABLE Singers (SingerId INT64 NOT NULL, FirstName STRING(MAX), "
           "LastName STRING(MAX)) PRIMARY KEY (SingerId)")
    with db.transaction() as tx:
        tx.insert("Singers", {"SingerId": 1, "FirstName": "A", "LastName": "B"})
    first = db.transaction()
    first.update("Singers", {"SingerId": 1, "LastName": "C"})
    before = first.commit()
    db.ddl(f"ALTER TABLE Singers ADD COLUMN ShardId INT64 AS ({SHARD}) STORED")
    assert db.read_row("Singers", 1)["ShardId"] == shard_of("A", "C")
    assert db.read_row("Singers", 1, read_timestamp=before)["ShardId"] == shard_of("A", "C")
    with db.transaction() as tx:
        tx.insert("Singers", {"SingerId": 2, "FirstName": "D", "LastName": "E"})
    assert db.read_row("Singers", 2)["ShardId"] == shard_of("D", "E")


def test_hostile_column_names_are_quoted_in_expressions(db: Database):
    db.ddl("CREATE TABLE `T x` (`k;` INT64 NOT NULL, `first 'name'` STRING(MAX), "
           "g STRING(MAX) AS (CONCAT(`first 'name'`, \"-\", 'x')) STORED) PRIMARY KEY (`k;`)")
    with db.transaction() as tx:
        tx.insert("T x", {"k;": 1, "first 'name'": "a; DROP TABLE x"})
    assert db.read_row("T x", 1)["g"] == "a; DROP TABLE x-x"


@pytest.mark.parametrize(("ddl", "needle"), [
    ("CREATE TABLE T (K INT64, G INT64 AS (MOD(Nope, 2)) STORED) PRIMARY KEY (K)",
     "refers to ['Nope']"),
    ("CREATE TABLE T (K INT64, G INT64 AS (MOD(K, 2)) STORED, H INT64 AS (G) STORED) "
     "PRIMARY KEY (K)", "refers to ['G']"),
    ("CREATE TABLE T (K INT64 AS (1) STORED) PRIMARY KEY (K)", "cannot be part of its primary"),
    ("CREATE TABLE T (K INT64, G INT64 AS (K) STORED NOT NULL) PRIMARY KEY (K)",
     "neither NOT NULL"),
    ("CREATE TABLE T (K INT64, G NUMERIC AS (K) STORED) PRIMARY KEY (K)", "not NUMERIC"),
    ("CREATE TABLE T (K INT64, G INT64 AS (MOD(K, 2)) ) PRIMARY KEY (K)", "STORED"),
    ("CREATE TABLE T (K INT64, G INT64 AS (SHA1(K)) STORED) PRIMARY KEY (K)",
     "unknown function SHA1"),
    ("CREATE TABLE T (K INT64, G INT64 AS (MOD(K, 2) STORED) PRIMARY KEY (K)", "STORED"),
])
def test_bad_generated_columns_are_ddl_errors(db: Database, ddl: str, needle: str):
    with pytest.raises(DdlError) as raised:
        db.ddl(ddl)
    assert needle in str(raised.value)
    assert db.tables() == []


def test_writing_a_generated_column_is_refused_and_writes_nothing(db: Database):
    db.ddl(SINGERS)
    tx = db.transaction()
    with pytest.raises(InvalidArgument, match=r"writes generated columns \['ShardId'\]"):
        tx.insert("Singers", {"SingerId": 1, "ShardId": 3})
    tx.rollback()
    assert db.scan("Singers") == []
