"""`collector_paused` pauses Python's cyclic collector inside its block and leaves it as it
found it, whatever way the block ends; the change source's reader, a generator, restores it
when a consumer stops early too."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import replace

import pytest

from cdcflow import Database
from cdcflow.model.collector import collector_paused
from cdcflow.model.timestamps import to_micros
from cdcflow.spark.options import parse_options
from cdcflow.spark.reading import change_slices, read_changes
from cdcflow.store.changelog import open_log

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after():
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_error_inside_restores_the_collector():
    with pytest.raises(ZeroDivisionError), collector_paused():
        _ = 1 / 0
    assert gc.isenabled()


def test_nested_pauses_restore_it_only_at_the_outermost_end():
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_generator_closed_early_restores_the_collector():
    def batches() -> Iterator[int]:
        with collector_paused():
            yield from range(10)

    reading = batches()
    assert next(reading) == 0
    assert not gc.isenabled()
    reading.close()  # the consumer stops after the first batch
    assert gc.isenabled()


def test_the_change_source_pauses_it_while_reading_and_restores_it(db: Database):
    """The reader (a generator Spark's worker drives) holds the collector paused from its
    first batch on; fully read, or dropped after one batch, it leaves the collector on."""
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = to_micros(db.current_timestamp())
    for number in range(3):
        with db.transaction() as tx:
            tx.insert_or_update("T", {"K": number, "V": "x"})
    end = to_micros(db.current_timestamp())
    options = parse_options({"database": db.path, "stream": "S"})
    [piece] = change_slices(options, open_log(db.path).partitions("S"), start, end)
    states = [(batch.num_rows, gc.isenabled()) for batch in read_changes(piece)]
    assert states == [(3, False)] and gc.isenabled()
    reading = read_changes(replace(piece, until=end))
    assert next(reading).num_rows == 3 and not gc.isenabled()
    del reading  # dropped, never closed by the caller
    assert gc.isenabled()
