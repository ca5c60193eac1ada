"""Names that what they name sees as one, and what a stream holds on its source server. A
stream's default replication slot and
publication ignore letter case and `-` against `_`; a filesystem that folds case (macOS's, by
default) ignores letter case in the stream's log, state and event folders, and in the folders
of its objects' CDC tables. Two such streams would take each other's slot (a stream's first
start drops a slot of its name and makes it anew) and publication; two such objects would
write one Delta table. Both are refused, naming the two and the rule, and nothing is
written. So is a stream that would use a slot, a publication or a MySQL replica server_id
that another stream of the catalog uses, given or by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.capture.source import SourceColumn, SourceObject
from cdcflow.errors import AlreadyExists, FailedPrecondition
from cdcflow.model.types import parse_type
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import ensure_tables
from cdcflow.table import CdcTable

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
    assert f"replication slot {slot!r}" in message
    assert [r.definition.name for r in catalog.streams()] == [first]
    catalog.create(definition(f"{first}2"))  # a name of its own is taken
    assert {r.definition.name for r in catalog.streams()} == {first, f"{first}2"}


def orders(name: str) -> SourceObject:
    return SourceObject(name, (SourceColumn("id", parse_type("INT64"), False, 1, 1),
                               SourceColumn("note", parse_type("STRING(MAX)"), True, None, 2)))


def test_objects_that_would_share_a_cdc_table_folder_are_refused(tmp_path: Path):
    """A link makes `public.orders` reach the folder of `public.Orders`, as a filesystem
    that folds case does: the stream's setup fails before it opens the second table."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    (warehouse / "public.orders").symlink_to("public.Orders")
    objects = [orders("public.Orders"), orders("public.orders")]
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("lake", warehouse), objects, tmp_path)
    assert str(refused.value).startswith(
        f"objects 'public.Orders' and 'public.orders' would share one CDC table: "
        f"'{warehouse / 'public.orders'}' is the folder of 'public.Orders'")
    assert sorted(p.name for p in warehouse.iterdir()) == ["public.Orders", "public.orders"]
    assert CdcTable.open(warehouse / "public.Orders").to_arrow().num_rows == 0


def test_objects_with_folders_of_their_own_each_get_a_table(tmp_path: Path):
    """Where the filesystem tells case apart, the two names are two tables."""
    warehouse = tmp_path / "warehouse"
    roots = ensure_tables(definition("lake", warehouse),
                          [orders("public.Orders"), orders("public.orders")], tmp_path)
    assert set(roots) == {"public.Orders", "public.orders"}
    assert len({Path(r).resolve() for r in roots.values()}) == 2
    again = ensure_tables(definition("lake", warehouse),  # a restart opens the same two
                          [orders("public.Orders"), orders("public.orders")], tmp_path)
    assert again == roots


@pytest.mark.parametrize(("first", "second", "what", "value", "field"), [
    (definition("a", slot="shared"), definition("b", slot="shared"),
     "replication slot", "shared", "source.slot"),
    (definition("a"), definition("b", slot="cdcflow_a"),  # a's by default
     "replication slot", "cdcflow_a", "source.slot"),
    (definition("a", publication="pub"), definition("b", publication="pub"),
     "publication", "pub", "source.publication"),
    (mysql("a", server_id=5401), mysql("b", server_id=5401),
     "replica server_id", "5401", "source.server_id"),
    (mysql("a"), mysql("b", server_id=mysql("a").replica_server_id()),
     "replica server_id", str(mysql("a").replica_server_id()), "source.server_id")])
def test_a_stream_that_would_hold_what_another_holds_is_refused(
        tmp_path: Path, first: StreamDefinition, second: StreamDefinition, what: str,
        value: str, field: str):
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(first)
    with pytest.raises(AlreadyExists) as refused:
        catalog.create(second)
    assert str(refused.value) == (
        f"stream 'b' would use the {what} {value!r} that stream 'a' uses: on one server, "
        f"each would take it from the other, so each stream of a catalog holds its own; "
        f"set {field}")
    assert [r.definition.name for r in catalog.streams()] == ["a"]


def test_streams_that_hold_their_own_are_created(tmp_path: Path):
    """Distinct slots, a publication named like another's slot (another kind of thing), an
    embedded stream beside them, and MySQL streams with ids of their own."""
    catalog = Catalog(tmp_path / "catalog.db")
    embedded = StreamDefinition.parse({
        "name": "c", "source": {"database": "shop.db", "change_stream": "Everything"},
        "destinations": [{"kind": "event_files", "root": "events"}]})
    for stream in (definition("a", slot="slot_a"), definition("b", publication="slot_a"),
                   embedded,
                   mysql("m1"), mysql("m2"), mysql("m3", server_id=5401)):
        catalog.create(stream)
    assert len(catalog.streams()) == 6
    assert mysql("m1").replica_server_id() != mysql("m2").replica_server_id()
