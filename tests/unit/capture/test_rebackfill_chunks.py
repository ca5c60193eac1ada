"""Which streamed changes win over the rows of a chunk read again (the DBLog window, and
transactions the chunk's snapshot could not see); the server-side half is in
tests/integration/postgres/test_postgres_rebackfill.py."""

from __future__ import annotations

import pytest

from cdcflow.capture.postgres.catalog import TypeCache
from cdcflow.capture.postgres.rebackfill import Chunk, Rebackfill, SnapshotView
from cdcflow.model.changes import SourceChange

pytestmark = pytest.mark.unit


def test_a_snapshot_sees_what_committed_before_it_modulo_2_to_the_32():
    view = SnapshotView.parse("100:105:101,103")
    assert view.sees(99) and view.sees(100 - 2**31 + 1)  # long before xmin
    assert view.sees(102) and view.sees(104)  # between, finished
    assert not view.sees(101) and not view.sees(103)  # running
    assert not view.sees(105) and not view.sees(200)  # at or after xmax
    wrapped = SnapshotView.parse(f"{2**32 + 5}:{2**32 + 9}:")  # the epoch is dropped
    assert wrapped.sees(2**32 - 3) and wrapped.sees(6) and not wrapped.sees(9)


def change(key: int, table: str = "public.items") -> SourceChange:
    return SourceChange(table, "UPDATE", {"id": key}, {"v": key}, {}, (), "NEW_VALUES", {})


class Item:
    name = "public.items"
    primary_key = ("id",)


def serving(view: str) -> Rebackfill:
    again = Rebackfill(None, None, TypeCache(), {}, {}, 100, {
        "id": "r1", "object": "public.items", "after": None, "chunks": 0, "rows": 0,
        "done": False, "since": 1})
    again.item = Item()  # type: ignore[assignment]
    again.chunk = Chunk({(k,): {"id": k, "v": 0} for k in range(1, 7)}, [6], False,
                        SnapshotView.parse(view))
    return again


def test_changes_the_chunk_snapshot_missed_win_even_before_the_low_watermark():
    again = serving("100:105:101")
    again.saw([change(1)], 99)  # seen by the snapshot: the chunk's row is as new
    again.saw([change(2)], 101)  # running when the chunk was read: its change wins
    again.saw([change(3)], 107)  # committed after the snapshot
    again.saw([change(4, "public.other")], 101)  # another table
    assert again.chunk is not None and sorted(again.chunk.rows) == [(1,), (4,), (5,), (6,)]
    again.chunk.open = True  # past the low watermark every change wins
    again.saw([change(5)], 99)
    assert sorted(again.chunk.rows) == [(1,), (4,), (6,)]


def test_a_busy_request_is_not_replaced_by_a_newer_one():
    again = serving("1:2:")
    again.take({"id": "r2", "object": "public.other"}, 5)
    assert again.state is not None and again.state["id"] == "r1"
    again.state = again.state | {"done": True}
    again.take({"id": "r2", "object": "public.other"}, 5)
    assert again.state["id"] == "r2" and again.state["since"] == 5 and not again.state["done"]


def test_recent_changes_the_snapshot_missed_are_left_out_of_a_new_chunk():
    again = serving("100:105:101")
    again.chunk = None  # between chunks: changes are only remembered
    again.saw([change(2)], 101)
    again.saw([change(3)], 99)
    chunk = Chunk({(k,): {"id": k} for k in (1, 2, 3)}, [3], False, SnapshotView.parse(
        "100:105:101"))
    chunk.drop_unseen(again.recent, ("id",))
    assert sorted(chunk.rows) == [(1,), (3,)]
