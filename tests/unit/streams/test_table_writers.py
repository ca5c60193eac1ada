"""One writer per CDC table. Two streams given one warehouse, each with an object of the same
name, would apply two sources' changes into one Delta table, each overwriting the other's
rows in the order of its own source (AP-2's sequence numbers of two sources do not compare).
The first writer to open a table claims it (`cdcflow.table.writers`); a second
is refused before it creates any table, naming both writers, the folder and the way out.
Streams whose objects differ share a warehouse freely, and a restart opens its own tables."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcflow import Database, FakeClock
from cdcflow.capture.source import SourceColumn, SourceObject
from cdcflow.errors import FailedPrecondition, Unavailable
from cdcflow.model.types import parse_type
from cdcflow.spark.pipeline import _embedded_tables, embedded_writer
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner
from cdcflow.streams.setup import ensure_tables
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable
from cdcflow.table.writers import WRITER_FILE, TableWriter
from tests.unit.streams.test_runner_failures import drive

pytestmark = pytest.mark.unit


def definition(name: str, warehouse: Path) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "source": {"kind": "postgres", "dsn": f"host=db dbname={name}"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(warehouse)}]})


def table(name: str) -> SourceObject:
    return SourceObject(name, (SourceColumn("id", parse_type("INT64"), False, 1, 1),
                               SourceColumn("note", parse_type("STRING(MAX)"), True, None, 2)))


def claim_of(root: Path) -> dict[str, str]:
    held: dict[str, str] = json.loads((root / "_cdcflow" / WRITER_FILE).read_text())
    return held


def test_a_second_stream_s_object_of_the_same_name_is_refused_before_any_table(
        tmp_path: Path):
    """Claims are made in name order before any table: `public.customers` is claimed, then
    `public.orders` is refused, and the claim made for the first is given back with the
    folder made for it. (Two streams starting at once so cannot each take a part.)"""
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders"), table("public.items")],
                  tmp_path)
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("b", warehouse),
                      [table("public.customers"), table("public.orders")], tmp_path)
    assert str(refused.value).startswith(
        f"stream 'b' would apply 'public.orders' into the CDC table "
        f"'{warehouse / 'public.orders'}', which stream 'a' applies 'public.orders' into: "
        "two writers, each in the order of its own source, would overwrite each other's "
        "rows; give one of the streams a warehouse of its own")
    assert not (warehouse / "public.customers").exists()  # checked before any table is made
    assert claim_of(warehouse / "public.orders")["writer"] == "stream:a"


def test_streams_with_objects_of_their_own_share_a_warehouse(tmp_path: Path):
    warehouse = tmp_path / "warehouse"
    first = ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    second = ensure_tables(definition("b", warehouse), [table("public.items")], tmp_path)
    assert ensure_tables(definition("a", warehouse), [table("public.orders")],
                         tmp_path) == first  # a restart opens its own table
    assert claim_of(Path(first["public.orders"])) == {
        "writer": "stream:a", "what": "stream 'a'", "object": "public.orders"}
    assert claim_of(Path(second["public.items"]))["writer"] == "stream:b"


def test_a_table_made_before_claims_goes_to_the_first_stream_that_opens_it(tmp_path: Path):
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    (warehouse / "public.orders" / "_cdcflow" / WRITER_FILE).unlink()  # as a table of before
    ensure_tables(definition("b", warehouse), [table("public.orders")], tmp_path)
    assert claim_of(warehouse / "public.orders")["writer"] == "stream:b"
    with pytest.raises(FailedPrecondition, match="which stream 'b' applies"):
        ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)


def test_the_message_names_the_file_whose_removal_hands_the_table_over(tmp_path: Path):
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("b", warehouse), [table("public.orders")], tmp_path)
    claim = warehouse / "public.orders" / "_cdcflow" / WRITER_FILE
    assert str(refused.value).endswith(
        f"If stream 'a' is gone for good, remove '{claim}' and this one takes the table over")
    claim.unlink()
    ensure_tables(definition("b", warehouse), [table("public.orders")], tmp_path)
    assert claim_of(warehouse / "public.orders")["writer"] == "stream:b"


def test_an_embedded_change_stream_s_tables_are_its_own(tmp_path: Path):
    """`apply_change_stream` claims its tables too; a runner stream given that warehouse
    and an object of a table's name is refused, and the other way round."""
    db = Database.open(str(tmp_path / "shop.db"))
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    warehouse = tmp_path / "warehouse"
    writer = embedded_writer(str(tmp_path / "shop.db"), "S")
    _embedded_tables(db, "S", warehouse, None, writer)
    with pytest.raises(FailedPrecondition, match=re.escape(
            f"which change stream 'S' of '{tmp_path / 'shop.db'}' applies 'Orders'")):
        ensure_tables(definition("a", warehouse), [table("Orders")], tmp_path)
    ensure_tables(definition("a", tmp_path / "other"), [table("Orders")], tmp_path)
    with pytest.raises(FailedPrecondition, match=r"change stream 'S' of .* would apply 'Orders'"):
        _embedded_tables(db, "S", tmp_path / "other", None, writer)
    db.close()


def test_a_claimed_folder_another_object_reaches_is_refused(tmp_path: Path):
    """A link makes `public.Orders` reach the folder `public.orders` is claimed in, as a
    filesystem that folds case does; the claim in the folder finds it though the stream
    no longer opens `public.orders` beside it."""
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    if not (warehouse / "public.Orders").exists():
        (warehouse / "public.Orders").symlink_to("public.orders")
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("a", warehouse), [table("public.Orders")], tmp_path)
    assert str(refused.value).startswith(
        "objects 'public.orders' and 'public.Orders' would share one CDC table: "
        f"'{warehouse / 'public.Orders'}' is the folder of 'public.orders'")


def claim_at_once(root: str, writer: str, ready: Any, results: Any,
                  legacy: str | None = None) -> None:
    ready.wait(30)
    try:
        TableWriter(writer, f"stream {writer!r}", "a warehouse of its own", legacy).claim(
            Path(root), "Orders")
        results.put((writer, "claimed"))
    except (FailedPrecondition, Unavailable) as error:
        results.put((writer, str(error)))


def claim_together(root: Path, writers: list[str], legacy: str | None = None
                   ) -> dict[str, str]:
    """Each writer claims `root` in a process of its own, all released at once: writer ->
    "claimed" or the error's message."""
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(len(writers)), context.Queue()
    workers = [context.Process(target=claim_at_once, args=(str(root), writer, ready, results,
                                                           legacy)) for writer in writers]
    for worker in workers:
        worker.start()
    outcomes = dict(results.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    return outcomes


def test_writers_that_claim_one_table_at_once_leave_exactly_one_writer(tmp_path: Path):
    """Processes released together claim one table: one succeeds, every other is refused
    naming it, and no aside file is left."""
    root = tmp_path / "Orders"
    CdcTable.ensure(root, pa.schema([pa.field("Id", pa.int64(), False)]), ["Id"])
    assert_one_writer(root, claim_together(root, [f"w{n}" for n in range(6)]))


def assert_one_writer(root: Path, outcomes: dict[str, str]) -> None:
    """One writer claimed `root`, every other was refused naming it, nothing is aside."""
    [winner] = [w for w, outcome in outcomes.items() if outcome == "claimed"]
    assert claim_of(root)["writer"] == winner
    for writer, outcome in outcomes.items():
        if writer != winner:
            assert f"which stream {winner!r} applies 'Orders' into" in outcome, outcome
    assert sorted(p.name for p in (root / "_cdcflow").iterdir()
                  if WRITER_FILE in p.name) == [WRITER_FILE]


def test_writers_that_take_over_one_legacy_claim_at_once_leave_exactly_one_writer(
        tmp_path: Path):
    """Six catalogs' streams of one name restart together on a table that an earlier
    cdcflow claimed by that name alone: one takes it over (under the folder's lock), each
    other is refused naming it, and nothing is left aside."""
    root = tmp_path / "Orders"
    CdcTable.ensure(root, pa.schema([pa.field("Id", pa.int64(), False)]), ["Id"])
    TableWriter("stream:lake", "stream 'lake'", "").claim(root, "Orders")
    assert_one_writer(root, claim_together(
        root, [f"stream:lake@catalog:c{n}" for n in range(6)], "stream:lake"))


@pytest.mark.parametrize("text", ['{"writer": "stream:a"', '{"writer": "stream:a"}', "[]",
                                  "\udcff"])
def test_a_damaged_claim_is_refused_naming_its_file(tmp_path: Path, text: str):
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    claim = warehouse / "public.orders" / "_cdcflow" / WRITER_FILE
    claim.write_bytes(text.encode(errors="surrogateescape"))
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    assert str(refused.value).startswith(
        f"the claim '{claim}' of the CDC table '{warehouse / 'public.orders'}' is not the JSON "
        "object {writer, what, object} that cdcflow writes there")
    assert claim.read_bytes() == text.encode(errors="surrogateescape")  # nothing written


def test_an_empty_claim_is_one_being_made_and_asks_for_a_retry(tmp_path: Path):
    """Only an exclusive create (no hard links) shows an empty claim, while its one write
    is on its way: Unavailable, which the runner retries, not a permanent refusal."""
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    claim = warehouse / "public.orders" / "_cdcflow" / WRITER_FILE
    claim.write_bytes(b"")
    with pytest.raises(Unavailable, match="is empty: another writer is making it"):
        ensure_tables(definition("b", warehouse), [table("public.orders")], tmp_path)


def test_where_hard_links_fail_an_exclusive_create_claims(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    """Some shared filesystems refuse hard links; the claim is then made by an exclusive
    create, and a second writer is refused all the same."""
    def no_links(source: object, target: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("cdcflow.table.writers.os.link", no_links)
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("public.orders")], tmp_path)
    assert claim_of(warehouse / "public.orders")["writer"] == "stream:a"
    with pytest.raises(FailedPrecondition, match="which stream 'a' applies"):
        ensure_tables(definition("b", warehouse), [table("public.orders")], tmp_path)
    assert [p.name for p in (warehouse / "public.orders" / "_cdcflow").iterdir()
            if WRITER_FILE in p.name] == [WRITER_FILE]


def make_shop(path: Path) -> None:
    """An embedded database of two tables, `Orders` and `Items`, and a change stream `S`."""
    db = Database.open(str(path))
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE TABLE Items (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    db.close()


def test_the_runner_fails_a_stream_whose_table_another_stream_holds(tmp_path: Path):
    """Through the runner: stream `b`, given stream `a`'s warehouse, fails its start
    permanently with the refusal recorded, and makes no table of its own."""
    make_shop(tmp_path / "shop.db")
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("a", warehouse), [table("Orders")], tmp_path)  # a's, before
    catalog = Catalog(tmp_path / "catalog.db", FakeClock())
    catalog.create(StreamDefinition.parse({
        "name": "b", "source": {"database": str(tmp_path / "shop.db"), "change_stream": "S"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(warehouse)}]}))
    catalog.act("b", "start")
    seen = drive(Runner(catalog.path, spark=None, clock=catalog.clock), catalog,
                 catalog.clock, "b", steps=50)
    assert [state for _, state in seen] == [StreamState.FAILED_PERMANENTLY]  # at once
    [error] = catalog.errors("b")
    assert (f"stream 'b' of the catalog '{catalog.path}' would apply 'Orders' into the CDC "
            "table") in error["message"]
    assert "which stream 'a' applies 'Orders' into" in error["message"]
    assert sorted(p.name for p in warehouse.iterdir()) == ["Orders"]  # no Items table


def test_two_catalogs_streams_of_one_name_are_two_writers(tmp_path: Path):
    """A stream is its catalog's: `lake` of one catalog and `lake` of another, given one
    warehouse, are two writers (their checkpoints' app ids are alike, so the Delta table
    would also take one's batches as the other's, and skip them). The second is refused,
    naming both catalogs; the first reopens its table."""
    warehouse = tmp_path / "warehouse"
    first, second = (Catalog(tmp_path / side / "catalog.db") for side in ("a", "b"))
    assert first.identity != second.identity
    assert Catalog(first.path).identity == first.identity  # kept across opens
    ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path, first)
    assert claim_of(warehouse / "public.orders")["writer"] == (
        f"stream:lake@catalog:{first.identity}")
    with pytest.raises(FailedPrecondition) as refused:
        ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path,
                      second)
    message = str(refused.value)
    assert f"stream 'lake' of the catalog '{tmp_path / 'b' / 'catalog.db'}' would apply" in (
        message)
    assert f"which stream 'lake' of the catalog '{tmp_path / 'a' / 'catalog.db'}' applies" in (
        message)
    assert ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path,
                         first) == {"public.orders": str((warehouse / "public.orders")
                                                         .resolve())}
    moved = tmp_path / "moved" / "catalog.db"
    moved.parent.mkdir()
    Path(first.path).rename(moved)  # a catalog moved elsewhere keeps its tables
    assert ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path,
                         Catalog(moved)) == {"public.orders": str((warehouse / "public.orders")
                                                                  .resolve())}


def test_a_claim_by_the_stream_s_name_alone_becomes_its_catalog_s(tmp_path: Path):
    """Tables claimed before catalogs were told apart hold the app id alone: the first
    stream of that name to open one takes it as its own and records its catalog, so a
    same-named stream of another catalog is refused from then on."""
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path)
    assert claim_of(warehouse / "public.orders")["writer"] == "stream:lake"
    first, second = (Catalog(tmp_path / side / "catalog.db") for side in ("a", "b"))
    ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path, first)
    assert claim_of(warehouse / "public.orders") == {
        "writer": f"stream:lake@catalog:{first.identity}", "object": "public.orders",
        "what": f"stream 'lake' of the catalog '{tmp_path / 'a' / 'catalog.db'}'"}
    with pytest.raises(FailedPrecondition, match="which stream 'lake' of the catalog"):
        ensure_tables(definition("lake", warehouse), [table("public.orders")], tmp_path,
                      second)
    assert [p.name for p in (warehouse / "public.orders" / "_cdcflow").iterdir()
            if WRITER_FILE in p.name] == [WRITER_FILE]  # nothing left aside


def test_the_runner_fails_a_stream_whose_table_another_catalog_s_stream_holds(
        tmp_path: Path):
    """Through the runner: catalog b's stream `lake`, given the warehouse where catalog a's
    `lake` holds `Orders`, fails its start permanently and makes no table."""
    make_shop(tmp_path / "shop.db")
    warehouse = tmp_path / "warehouse"
    ensure_tables(definition("lake", warehouse), [table("Orders")], tmp_path,
                  Catalog(tmp_path / "a" / "catalog.db"))
    catalog = Catalog(tmp_path / "b" / "catalog.db", FakeClock())
    catalog.create(StreamDefinition.parse({
        "name": "lake", "source": {"database": str(tmp_path / "shop.db"),
                                   "change_stream": "S"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(warehouse)}]}))
    catalog.act("lake", "start")
    seen = drive(Runner(catalog.path, spark=None, clock=catalog.clock), catalog,
                 catalog.clock, "lake", steps=50)
    assert [state for _, state in seen] == [StreamState.FAILED_PERMANENTLY]
    [error] = catalog.errors("lake")
    assert "which stream 'lake' of the catalog" in error["message"]
    assert sorted(p.name for p in warehouse.iterdir()) == ["Orders"]  # no Items table
