"""The watcher's cleanup (issue 13, CW-6), as a Python call and as `cdcflow watcher cleanup`:
rows older than the age lose their commit timestamp and leave the index, newer ones stay;
an age shorter than the watcher's lag plus one poll interval is refused, as is a cleanup
before the watcher has read anything."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.cli.main import cli
from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.cleanup import cleanup
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source
from tests.unit.store.test_generated_columns import SINGERS

pytestmark = pytest.mark.unit
INDEX = "CREATE NULL_FILTERED INDEX SingersByShard ON Singers (ShardId, LastModified)"
ALL = [list(range(-18, 19))]


def watched(tmp_path: Path) -> tuple[Database, Catalog]:
    database = Database.open(str(tmp_path / "shop.db"))
    database.ddl([SINGERS, INDEX, "CREATE TABLE Other (K INT64) PRIMARY KEY (K)"])
    old = datetime.now(UTC) - timedelta(hours=1)
    with database.transaction() as tx:
        for number in range(10):
            tx.insert("Singers", {"SingerId": number, "FirstName": "f", "LastName": f"{number}",
                                  "LastModified": old if number < 6 else COMMIT_TIMESTAMP})
    catalog = Catalog(tmp_path / "catalog.db")
    definition = StreamDefinition.parse({"name": "watch", "source": {
        "kind": "watcher", "target": {"kind": "embedded", "database": database.path},
        "tables": [{"name": "Singers", "commit_timestamp_column": "LastModified",
                    "shard_column": "ShardId", "shard_values": [-18, 18]}],
        "poll_interval_seconds": 2},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "e")}]})
    catalog.create(definition)
    return database, catalog


def test_cleanup_takes_old_rows_out_of_the_index(tmp_path: Path):
    database, catalog = watched(tmp_path)
    with pytest.raises(FailedPrecondition, match="has not polled yet"):
        cleanup(catalog, "watch", "Singers", timedelta(minutes=30))
    source = open_source(catalog.get("watch").definition, tmp_path)
    source.release(source.snapshot(source.discover(), None))  # the watcher's first horizon
    source.close()
    with pytest.raises(InvalidArgument, match=r"shorter than the watcher's lag plus one poll"):
        cleanup(catalog, "watch", "Singers", timedelta(seconds=1))
    with pytest.raises(InvalidArgument, match="'Other' is not watched"):
        cleanup(catalog, "watch", "Other", timedelta(minutes=30))
    done = cleanup(catalog, "watch", "Singers", timedelta(minutes=30), batch_rows=4)
    assert done.rows == 6
    assert sorted(p.row["SingerId"] for p in database.poll_index("SingersByShard", ALL)) == \
        [6, 7, 8, 9]
    assert database.read_row("Singers", 0)["LastModified"] is None
    result = CliRunner().invoke(cli, ["watcher", "--catalog", str(catalog.path), "cleanup",
                                      "watch", "Singers", "--older-than", "30m", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["rows"] == 0, result.output
    result = CliRunner().invoke(cli, ["watcher", "--catalog", str(catalog.path), "cleanup",
                                      "watch", "Singers", "--older-than", "soon", "--json"])
    assert result.exit_code == 2 and "'soon' must be a number" in result.output
    database.close()
