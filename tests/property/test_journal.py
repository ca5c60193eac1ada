"""The commit journal (CS-1, CS-2, CS-7; `cdcflow.store.journal`): a native commit's records,
rendered when a reader or a change of catalog or partitions settles the journal, are the very
log rows that rendering them at commit gives: same partitions, tokens, sequences, flags and
bodies. Two files get the same random operations (commits, ADD COLUMN, a stream's scope and
value capture type, a new stream, splits and merges) at the same clock times. One is settled
after every operation, as if its records were rendered at commit; the other only at the end.
Their logs and partitions are identical."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow import Database, PartitionPolicy
from cdcflow.clock import FakeClock
from cdcflow.errors import NotFound
from cdcflow.model.schema import VALUE_CAPTURE_TYPES

pytestmark = pytest.mark.property

SETUP = [
    "CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(MAX), Amount INT64) PRIMARY KEY (Id)",
    "CREATE TABLE Lines (Id INT64 NOT NULL, Qty INT64) PRIMARY KEY (Id)",
    "CREATE CHANGE STREAM S FOR ALL",
]

mutations = st.lists(st.tuples(
    st.sampled_from(["insert_or_update", "replace", "delete"]),
    st.sampled_from(["Orders", "Lines"]), st.integers(0, 6),
    st.one_of(st.none(), st.integers(-3, 3)), st.one_of(st.none(), st.text(max_size=3)),
), min_size=1, max_size=6)

operations = st.lists(st.one_of(
    st.tuples(st.just("commit"), mutations),
    st.tuples(st.just("commit"), mutations),
    st.tuples(st.just("commit"), mutations),
    st.tuples(st.just("ddl"), st.sampled_from([
        "ALTER TABLE Orders ADD COLUMN Extra{n} STRING(MAX)",
        "ALTER CHANGE STREAM S SET FOR Orders",
        "ALTER CHANGE STREAM S SET FOR Orders(Note), Lines",
        "ALTER CHANGE STREAM S SET FOR ALL",
        "CREATE CHANGE STREAM T{n} FOR Lines",
    ])),
    st.tuples(st.just("capture"), st.sampled_from(VALUE_CAPTURE_TYPES)),
    st.tuples(st.just("split"), st.integers(0, 3)),
    st.tuples(st.just("merge"), st.integers(0, 3)),
), min_size=1, max_size=14)


def _apply(db: Database, operation: tuple[str, Any], number: int) -> None:
    kind, argument = operation
    if kind == "commit":
        with contextlib.suppress(NotFound):  # a delete of a missing row: in both files
            _commit(db, argument)
    elif kind == "ddl":
        db.ddl(argument.format(n=number))
    elif kind == "capture":
        db.ddl(f"ALTER CHANGE STREAM S SET OPTIONS (value_capture_type = '{argument}')")
    else:
        active = sorted((p for p in db.partitions("S") if p.end_timestamp is None),
                        key=lambda p: p.key_range.start)
        first = active[argument % len(active)]
        if kind == "split":
            db.split_partition("S", first.token)
        elif len(active) > 1:
            index = argument % (len(active) - 1)
            db.merge_partitions("S", [active[index].token, active[index + 1].token])


def _commit(db: Database, mutations: list[tuple[str, str, int, Any, Any]]) -> None:
    with db.transaction() as tx:
        for method, table, key, amount, note in mutations:
            if method == "delete":
                tx.delete(table, {"Id": key})
            elif table == "Orders":
                getattr(tx, method)(table, {"Id": key, "Amount": amount, "Note": note})
            else:
                getattr(tx, method)(table, {"Id": key, "Qty": amount})


def _contents(path: Path) -> tuple[str, list[str], int]:
    """The log and the partitions as text, the partition tokens in order of the partitions
    (tokens are random: the files are compared with one's tokens named as the other's),
    and how many commits the journal holds."""
    conn = sqlite3.connect(path)
    try:
        partitions = conn.execute("SELECT * FROM _partitions ORDER BY stream, start_micros, "
                                  "range_start").fetchall()
        log = conn.execute("SELECT l.stream, l.commit_micros, p.start_micros, p.range_start, "
                           "l.seq, l.kind, l.mods, l.body FROM _log AS l JOIN _partitions AS p "
                           "ON p.stream = l.stream AND p.token = l.token ORDER BY l.stream, "
                           "p.start_micros, p.range_start, l.commit_micros, l.seq").fetchall()
        (pending,) = conn.execute("SELECT COUNT(*) FROM _journal").fetchone()
        return repr((partitions, log)), [row[1] for row in partitions], pending
    finally:
        conn.close()


@settings(max_examples=60, deadline=None)
@given(operations)
def test_records_settled_late_are_the_records_settled_at_commit(steps: list[tuple[str, Any]]):
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / "eager.db", Path(folder) / "late.db"]
        clocks = [FakeClock(), FakeClock()]
        dbs = [Database.open(path, clock=clock, partition_policy=PartitionPolicy(auto=False))
               for path, clock in zip(paths, clocks, strict=True)]
        for db in dbs:
            db.ddl(SETUP)
        eager, late = dbs
        for number, step in enumerate(steps):
            for db, clock in zip(dbs, clocks, strict=True):
                clock.advance(timedelta(milliseconds=1))
                _apply(db, step, number)
            eager.current_timestamp()  # a reader: settles the journal
        eager_text, eager_tokens, eager_pending = _contents(paths[0])
        assert eager_pending == 0
        late.current_timestamp()
        late_text, late_tokens, late_pending = _contents(paths[1])
        assert late_pending == 0 and len(late_tokens) == len(eager_tokens)
        for late_token, eager_token in zip(late_tokens, eager_tokens, strict=True):
            late_text = late_text.replace(late_token, eager_token)
        assert late_text == eager_text
        for db in dbs:
            db.close()
