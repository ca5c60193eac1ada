"""A watcher stream's definition (issue 13): shard values as a range or a list, and bad
definitions as typed errors naming the field; a table without a TIMESTAMP commit column is
refused when the source opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database
from cdcflow.errors import InvalidArgument, NotFound
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source

pytestmark = pytest.mark.unit


def parse(source: dict[str, Any]) -> StreamDefinition:
    return StreamDefinition.parse({"name": "w", "source": source, "destinations": [
        {"kind": "event_files", "root": "e"}]})


def watcher(**table: Any) -> dict[str, Any]:
    return {"kind": "watcher", "target": {"kind": "embedded", "database": "shop.db"},
            "tables": [{"name": "Singers", "commit_timestamp_column": "LastModified",
                        **table}]}


def test_shard_values_are_a_range_or_a_list():
    ranged = parse(watcher(shard_column="ShardId", shard_values=[-18, 18])).source
    assert ranged.tables[0].shards() == tuple(range(-18, 19))  # type: ignore[union-attr]
    listed = parse(watcher(shard_column="ShardId", shard_values={"in": [3, 1]})).source
    assert listed.tables[0].shards() == (3, 1)  # type: ignore[union-attr]
    assert parse(watcher()).source.tables[0].shards() is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("source", "needle"), [
    (watcher(shard_column="ShardId"), "shard_column and shard_values go together"),
    (watcher(shard_values=[1, 2]), "shard_column and shard_values go together"),
    (watcher(shard_column="S", shard_values=[5, 1]), "inclusive range"),
    (watcher(shard_column="S", shard_values={"in": []}), "1..10000"),
    (watcher(shard_column="S", shard_values=[1, 2, 3]), "shard_values"),
    (watcher() | {"poll_interval_seconds": 0.01}, "poll_interval_seconds"),
    (watcher() | {"tables": []}, "tables"),
    (watcher() | {"target": {"kind": "oracle", "database": "x"}}, "target"),
])
def test_bad_watcher_definitions_are_typed_errors(source: dict[str, Any], needle: str):
    with pytest.raises(InvalidArgument) as raised:
        parse(source)
    assert needle in str(raised.value)


def test_tables_and_columns_are_checked_against_the_database(tmp_path: Path):
    path = str(tmp_path / "shop.db")
    Database.open(path).ddl("CREATE TABLE Singers (SingerId INT64 NOT NULL, LastModified "
                            "STRING(MAX), ShardId STRING(MAX)) PRIMARY KEY (SingerId)")
    for table, error, needle in (
            ({"name": "Nope"}, NotFound, "'Nope' does not exist"),
            ({}, InvalidArgument, "'LastModified' is STRING, not a TIMESTAMP")):
        source = watcher(**table) | {"target": {"kind": "embedded", "database": path}}
        with pytest.raises(error, match=needle):
            open_source(parse(source), tmp_path).discover()
