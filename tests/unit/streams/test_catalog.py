"""Stream definitions (YAML and Python), the catalog (persisted states, status, errors) and
discovery (EV-9, EV-10)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.discovery import discover_embedded
from cdcflow.streams.states import StreamState

pytestmark = pytest.mark.unit

YAML = """
name: shop-to-lake
source: {kind: embedded, database: shop.db, change_stream: Everything}
include: ["*"]
exclude: ["Audit*"]
backfill: all
destinations:
  - {kind: cdc_table, warehouse: warehouse, max_staleness_seconds: 60}
  - {kind: event_files, root: events, format: avro, max_events: 500}
spark: {master: "local[2]", trigger_seconds: 0.5}
"""


def test_yaml_round_trip_and_object_selection():
    definition = StreamDefinition.from_yaml(YAML)
    assert StreamDefinition.from_yaml(definition.to_yaml()) == definition
    assert definition.selects("Orders") and not definition.selects("AuditLog")
    assert definition.destinations[1].kind == "event_files"
    assert definition.spark.master == "local[2]"


@pytest.mark.parametrize(("spark", "limit"), [
    ('{master: "local[2]"}', 25_000),
    ('{master: "local[2]", max_records_per_trigger: null}', 25_000),
    ('{master: "local[2]", max_records_per_trigger: 7}', 7),
])
def test_a_batch_holds_at_most_25000_changes_unless_told_otherwise(
        tmp_path: Path, spark: str, limit: int):
    """Without a limit, a backlog after a long pause was one batch, held whole in memory by
    the tasks that fold it. A definition the catalog stored while null meant no limit gets
    the default too, as does one read from YAML."""
    definition = StreamDefinition.from_yaml(
        YAML.replace('{master: "local[2]", trigger_seconds: 0.5}', spark))
    assert definition.spark.max_records_per_trigger == limit
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(definition)
    assert catalog.get(definition.name).definition.spark.max_records_per_trigger == limit
    with sqlite3.connect(tmp_path / "catalog.db") as conn:  # as stored before the default
        stored = json.loads(conn.execute("SELECT definition FROM streams").fetchone()[0])
        stored["spark"]["max_records_per_trigger"] = None
        conn.execute("UPDATE streams SET definition = ?", (json.dumps(stored),))
    conn.close()
    assert catalog.get(definition.name).definition.spark.max_records_per_trigger == 25_000


@pytest.mark.parametrize(("text", "needle"), [
    ("name: [", "not valid YAML"),
    (YAML.replace("trigger_seconds: 0.5", "max_records_per_trigger: 0"),
     "max_records_per_trigger"),
    ("- a list", "mapping"),
    (YAML.replace("shop-to-lake", "9bad name"), "name"),
    (YAML.replace("backfill: all", "backfill: some"), "backfill"),
    (YAML.replace("format: avro", "format: csv"), "format"),
    (YAML.replace("max_events: 500", "max_events: 0"), "max_events"),
    (YAML.replace("include:", "includes:"), "includes"),
    (YAML.split("destinations:")[0] + "destinations: []", "destinations"),
    (YAML.replace('"local[2]"', "yarn"), "spark.master: Value error, Spark master 'yarn' is not"),
    (YAML.replace('"local[2]"', '"spark://host"'), "'host' is not HOST:PORT"),
])
def test_bad_definitions_are_rejected_with_the_field(text: str, needle: str):
    with pytest.raises(InvalidArgument) as caught:
        StreamDefinition.from_yaml(text)
    assert needle in str(caught.value)


def test_catalog_persists_states_status_and_errors(tmp_path: Path):
    catalog = Catalog(tmp_path / "catalog.db")
    definition = StreamDefinition.from_yaml(YAML)
    catalog.create(definition)
    with pytest.raises(AlreadyExists, match="shop-to-lake"):
        catalog.create(definition)
    assert catalog.act("shop-to-lake", "start") == StreamState.STARTING
    assert catalog.act("shop-to-lake", "started") == StreamState.RUNNING
    with pytest.raises(FailedPrecondition, match="RUNNING"):
        catalog.act("shop-to-lake", "resume")
    with pytest.raises(FailedPrecondition, match="RUNNING"):
        catalog.delete("shop-to-lake")
    catalog.update_status("shop-to-lake", rows_processed=42, backfill={"Orders": "COMPLETED"})
    catalog.record_error("shop-to-lake", "Orders", "disk full")
    reopened = Catalog(tmp_path / "catalog.db")  # a restarted runner sees it all
    record = reopened.get("shop-to-lake")
    assert record.state == StreamState.RUNNING and record.definition == definition
    assert reopened.status("shop-to-lake")["rows_processed"] == 42
    assert reopened.errors("shop-to-lake")[0]["message"] == "disk full"
    reopened.act("shop-to-lake", "fail")
    reopened.act("shop-to-lake", "retry")
    assert reopened.get("shop-to-lake").retries == 1
    reopened.act("shop-to-lake", "pause")
    reopened.delete("shop-to-lake")
    assert reopened.streams() == []
    with pytest.raises(NotFound, match="shop-to-lake"):
        reopened.get("shop-to-lake")


def test_discovery_lists_objects_and_fields(db: Database):
    db.ddl("CREATE TABLE T (A STRING(10) NOT NULL, B INT64 NOT NULL, C ARRAY<INT64>) "
           "PRIMARY KEY (B, A)")
    (found,) = discover_embedded(db.path)
    assert found["object"] == "T" and found["primary_key"] == ["B", "A"]
    assert found["fields"] == [
        {"name": "A", "type": "STRING(10)", "primary_key_position": 2, "nullable": False,
         "ordinal_position": 1},
        {"name": "B", "type": "INT64", "primary_key_position": 1, "nullable": False,
         "ordinal_position": 2},
        {"name": "C", "type": "ARRAY<INT64>", "primary_key_position": None, "nullable": True,
         "ordinal_position": 3},
    ]
    with pytest.raises(NotFound, match="does not exist"):
        discover_embedded(db.path + ".missing")
