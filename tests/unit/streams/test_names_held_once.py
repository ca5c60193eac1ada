"""Names that what they name sees as one, and what a stream holds on its source server.

A stream's default replication slot and publication ignore letter case and `-` against `_`;
a filesystem that folds case (macOS's, by default) ignores letter case in the stream's log,
state and event folders, and in the folders of its objects' CDC tables. Two such streams
would take each other's slot (a stream's first start drops its slot, unless a reader holds
it, and makes it anew) and publication (it sets the publication's tables); two such objects
would write one Delta table. Both are refused, naming the two and the rule, and nothing is
written. So is a stream that would use a slot, a publication or a MySQL replica server_id
that another stream of the catalog uses on the same server, given or by default."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.capture.source import SourceColumn, SourceObject
from cdcflow.errors import AlreadyExists, FailedPrecondition
from cdcflow.model.types import parse_type
from cdcflow.spark.pipeline import _embedded_tables, embedded_writer
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import ensure_tables

pytestmark = pytest.mark.unit


def definition(name: str, warehouse: Path | None = None, **source: object
               ) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "source": {"kind": "postgres", "dsn": "host=db dbname=shop user=cdc",
                                 **source},
        "destinations": [{"kind": "cdc_table", "warehouse": str(warehouse or "warehouse")}]})


def mysql(name: str, **source: object) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "source": {"kind": "mysql", "host": "db", "user": "cdc",
                                 "databases": ["shop"], **source},
        "destinations": [{"kind": "event_files", "root": "events"}]})


@pytest.mark.parametrize(("first", "second"), [("lake", "Lake"), ("shop-lake", "shop_lake"),
                                               ("Shop_Lake", "shop-lake")])
def test_a_stream_whose_name_folds_to_another_s_is_refused(tmp_path: Path, first: str,
                                                          second: str):
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(definition(first))
    slot = definition(first).slot_name()
    assert slot == definition(second).slot_name()  # what the rule guards
    with pytest.raises(AlreadyExists) as refused:
        catalog.create(definition(second))
    message = str(refused.value)
    assert f"stream {second!r} differs from stream {first!r} only in letter case" in message
    assert f"default replication slot and publication {slot!r}" in message
    assert [r.definition.name for r in catalog.streams()] == [first]
    catalog.create(definition(f"{first}2"))  # a name of its own is taken
    assert {r.definition.name for r in catalog.streams()} == {first, f"{first}2"}


def folds_case(path: Path, target: str) -> None:
    """Make `path` reach the folder `target` beside it, as a filesystem that folds case
    does by itself (where it does, nothing is to be done)."""
    if not path.exists():
        path.symlink_to(target)


def orders(name: str) -> SourceObject:
    return SourceObject(name, (SourceColumn("id", parse_type("INT64"), False, 1, 1),
                               SourceColumn("note", parse_type("STRING(MAX)"), True, None, 2)))


def test_objects_that_would_share_a_cdc_table_folder_are_refused(tmp_path: Path):
    """A link makes `public.orders` reach the folder of `public.Orders`, as a filesystem
    that folds case does: the stream's setup fails before it makes either table."""
    warehouse = tmp_path / "warehouse"
    (warehouse / "public.Orders").mkdir(parents=True)
    folds_case(warehouse / "public.orders", "public.Orders")
    objects = [orders("public.Orders"), orders("public.orders")]
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("lake", warehouse), objects, tmp_path)
    assert str(refused.value).startswith(
        f"objects 'public.Orders' and 'public.orders' would share one CDC table: "
        f"'{warehouse / 'public.orders'}' is the folder of 'public.Orders'")
    assert list((warehouse / "public.Orders").iterdir()) == []  # no table, no claim kept


def test_tables_of_the_embedded_database_that_would_share_a_folder_are_refused(
        tmp_path: Path):
    """The embedded database holds `Orders` beside `orders`; `apply_change_stream` makes
    their CDC tables, and refuses the second where it would open the first's folder."""
    db = Database.open(str(tmp_path / "shop.db"))
    for table in ("Orders", "orders"):
        db.ddl(f"CREATE TABLE {table} (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    warehouse = tmp_path / "warehouse"
    (warehouse / "Orders").mkdir(parents=True)
    folds_case(warehouse / "orders", "Orders")
    with pytest.raises(FailedPrecondition, match="objects 'Orders' and 'orders' would share"):
        _embedded_tables(db, "S", warehouse, None,
                         embedded_writer(str(tmp_path / "shop.db"), "S"))
    db.close()


def test_objects_with_folders_of_their_own_each_get_a_table(tmp_path: Path):
    """Where the filesystem tells case apart, the two names are two tables."""
    warehouse = tmp_path / "warehouse"
    (warehouse / "Probe").mkdir(parents=True)
    if (warehouse / "probe").exists():  # it folds case: the test above is this one here
        with pytest.raises(FailedPrecondition):
            ensure_tables(definition("lake", warehouse),
                          [orders("public.Orders"), orders("public.orders")], tmp_path)
        return
    roots = ensure_tables(definition("lake", warehouse),
                          [orders("public.Orders"), orders("public.orders")], tmp_path)
    assert set(roots) == {"public.Orders", "public.orders"}
    assert len({Path(r).resolve() for r in roots.values()}) == 2
    again = ensure_tables(definition("lake", warehouse),  # a restart opens the same two
                          [orders("public.Orders"), orders("public.orders")], tmp_path)
    assert again == roots


OTHER_DB = "host=db dbname=other user=cdc"


@pytest.mark.parametrize(("first", "second", "what", "value", "server", "field"), [
    (definition("a", slot="shared"), definition("b", slot="shared"),
     "replication slot", "shared", "db:5432", "source.slot"),
    (definition("a"), definition("b", slot="cdcflow_a", dsn=OTHER_DB),  # a's by default;
     "replication slot", "cdcflow_a", "db:5432", "source.slot"),  # a slot is the server's
    (definition("a", slot="s", dsn="postgresql://db1,db2:5433/shop"),  # one host in common
     definition("b", slot="s", dsn="host=db2,db3 port=5433,5432"),
     "replication slot", "s", "db2:5433", "source.slot"),
    (definition("a", slot="s", dsn="hostaddr=10.0.0.1 port=5433"),
     definition("b", slot="s", dsn="postgresql://10.0.0.1:5433/shop"),
     "replication slot", "s", "10.0.0.1:5433", "source.slot"),
    (definition("a", publication="pub"), definition("b", publication="pub"),
     "publication", "pub", "db:5432/shop", "source.publication"),
    (definition("a", publication="pub", dsn="host=db user=shop"),  # dbname: the user's
     definition("b", publication="pub"), "publication", "pub", "db:5432/shop",
     "source.publication"),
    (mysql("a", server_id=5401), mysql("b", server_id=5401),
     "replica server_id", "5401", "db:3306", "source.server_id"),
    (mysql("a"), mysql("b", server_id=mysql("a").replica_server_id()),
     "replica server_id", str(mysql("a").replica_server_id()), "db:3306",
     "source.server_id")])
def test_a_stream_that_would_hold_what_another_holds_is_refused(
        tmp_path: Path, first: StreamDefinition, second: StreamDefinition, what: str,
        value: str, server: str, field: str):
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(first)
    with pytest.raises(AlreadyExists) as refused:
        catalog.create(second)
    assert str(refused.value) == (
        f"stream 'b' would use the {what} {value!r} on {server} that stream 'a' uses: each "
        f"would take it from the other; set {field}")
    assert [r.definition.name for r in catalog.streams()] == ["a"]


def test_streams_that_hold_their_own_are_created(tmp_path: Path):
    """Distinct slots, a publication named like another's slot (another kind of thing), an
    embedded stream beside them, and MySQL streams with ids of their own."""
    catalog = Catalog(tmp_path / "catalog.db")
    embedded = StreamDefinition.parse({
        "name": "c", "source": {"database": "shop.db", "change_stream": "Everything"},
        "destinations": [{"kind": "event_files", "root": "events"}]})
    for stream in (definition("a", slot="slot_a"), definition("b", publication="slot_a"),
                   embedded, mysql("m1"), mysql("m2"), mysql("m3", server_id=5401),
                   mysql("m4", server_id=5401, host="db2"),  # the same id, another server
                   definition("d", slot="slot_a", dsn="host=db2 dbname=shop"),
                   definition("e", publication="cdcflow_a", dsn=OTHER_DB),  # other database
                   definition("f", slot="slot_a", dsn="hostaddr=10.0.0.2"),  # other servers
                   definition("g", slot="slot_a", dsn="host=db,db2 port=5433"),
                   definition("h", slot="slot_a", dsn="service=shop"),
                   definition("i", publication="slot_a", dsn="host=db user=other")):
        catalog.create(stream)
    assert len(catalog.streams()) == 13
    assert mysql("m1").replica_server_id() != mysql("m2").replica_server_id()


def test_a_stored_definition_this_version_cannot_read_still_holds_its_name(tmp_path: Path):
    """A stream stored by another version, whose definition this one cannot parse, does not
    stop others from being created; its own name (and what folds to it) is still refused."""
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(definition("old"))
    with sqlite3.connect(tmp_path / "catalog.db") as conn:
        conn.execute("UPDATE streams SET definition = ? WHERE name = 'old'",
                     ('{"name": "old", "source": {"kind": "carrier-pigeon"}}',))
    catalog.create(definition("new", slot="cdcflow_old"))
    with pytest.raises(AlreadyExists, match="'Old' differs from stream 'old'"):
        catalog.create(definition("Old"))
