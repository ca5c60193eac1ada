"""Damaged files, fuzzed (issue 14, fuzzed input): event files and batch manifests cut short
or with bytes changed on disk, and Spark checkpoint offsets edited by hand. Each either
reads back exactly what was written, or raises a `cdcflow.errors` type naming the file (or
the value) and the rule; a damaged file is never skipped or read as empty."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow import Database
from cdcflow.errors import CdcflowError, DataLoss, InvalidArgument
from cdcflow.events.avro_format import read_avro
from cdcflow.events.files import EventFileWriter, check_count, named_bytes
from cdcflow.spark.offsets import OFFSET_VERSION, StreamOffset
from tests.unit.events.test_events import SAMPLE, events_of

pytestmark = pytest.mark.property
SETTINGS = settings(derandomize=True, deadline=None, max_examples=150,
                    suppress_health_check=[HealthCheck.too_slow])


def written(fmt: str) -> tuple[Path, list[tuple[Path, int]], list[list[str]]]:
    """A folder with three committed batches of real events; their files, and the uuids
    of each batch."""
    folder = Path(tempfile.mkdtemp(prefix="fuzz-events-"))
    db = Database.open(str(folder / "shop.db"))
    db.ddl([SAMPLE, "CREATE CHANGE STREAM s FOR ALL"])
    for batch in range(2):
        with db.transaction() as tx:
            for key in range(5):
                tx.insert_or_update("SAMPLE", {"THIS_IS_MY_PK": batch * 10 + key,
                                               "FIELD1": "x" * key, "FIELD2": "y"})
    events = events_of(db, "s")
    db.close()
    writer = EventFileWriter(folder / "events", "s", fmt)
    batches = [events[:4], events[4:7], events[7:]]
    for number, batch in enumerate(batches):
        writer.write_batch(number, batch)
    return folder, writer.committed_parts(), [[e.uuid for e in b] for b in batches]


FIXTURES = {fmt: written(fmt) for fmt in ("json", "avro")}


def read_all(folder: Path, fmt: str) -> list[str]:
    """The uuids of every committed event, read the way `cdcflow verify` reads them."""
    uuids = []
    for part in EventFileWriter(folder / "events", "s", fmt).committed_parts():
        if fmt == "json":
            uuids += [e["uuid"] for e in part.json_events()]
        else:
            events = list(read_avro(named_bytes(part.path, part.read_bytes())))
            check_count(part.path, len(events), part.events)
            uuids += [e.uuid for e in events]
    return uuids


damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 0.999)),
    st.tuples(st.just("flip"), st.floats(0, 0.999), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("empty"), st.just(0)),
    st.tuples(st.just("delete"), st.just(0)),
)


def damaged(data: bytes, how: tuple) -> bytes | None:
    at = int(len(data) * how[1])
    match how[0]:
        case "truncate":
            return data[:at]
        case "flip":
            return data[:at] + bytes([data[at] ^ how[2]]) + data[at + 1:]
        case "insert":
            return data[:at] + how[2] + data[at:]
        case "empty":
            return b""
    return None  # delete


@pytest.mark.parametrize("fmt", ["json", "avro"])
@SETTINGS
@given(target=st.integers(0, 100), how=damage, manifest=st.booleans())
def test_a_damaged_event_file_or_manifest_is_named_never_read_short(
        fmt: str, target: int, how: tuple, manifest: bool):
    source, parts, uuids = FIXTURES[fmt]
    folder = Path(tempfile.mkdtemp(prefix="fuzz-copy-"))
    try:
        shutil.copytree(source / "events", folder / "events")
        files = sorted((folder / "events" / "s" / "_manifests").glob("*.json")) if manifest \
            else [folder / "events" / p.path.relative_to(source / "events") for p in parts]
        victim = files[target % len(files)]
        before = victim.read_bytes()
        after = damaged(before, how)
        if after is None:
            victim.unlink()
        else:
            victim.write_bytes(after)
        try:
            found = read_all(folder, fmt)
        except CdcflowError as error:
            assert isinstance(error, DataLoss), error
            assert str(victim) in str(error) or victim.name in str(error), str(error)
            return
        # read without an error: every event of every batch still committed, exactly once
        # (the first or last manifest gone reads as a batch not written yet)
        kept = [u for number, batch in enumerate(uuids) for u in batch
                if after is not None or victim.name != f"batch-{number:012d}.json"]
        assert sorted(found) == sorted(kept), (how, victim)
        assert after is not None or victim.name in ("batch-000000000000.json",
                                                     "batch-000000000002.json")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


offsets = st.one_of(
    st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.fixed_dictionaries({"version": st.just(OFFSET_VERSION),
                           "timestamp": st.one_of(st.integers(-5, 2**62), st.text(max_size=5),
                                                  st.floats(), st.booleans(), st.none()),
                           "partitions": st.one_of(
                               st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
                               st.lists(st.text(max_size=3), max_size=3), st.none(),
                               st.text(max_size=5))}),
    st.dictionaries(st.sampled_from(["version", "timestamp", "partitions", "x"]),
                    st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=4),
)


@SETTINGS
@given(data=offsets)
def test_a_checkpoint_offset_edited_by_hand_is_an_offset_or_a_typed_error(data: object):
    """What Spark hands the source back from its offset log, edited by hand."""
    try:
        offset = StreamOffset.from_dict(data)
    except InvalidArgument as error:
        assert str(error).startswith("offset "), str(error)
        return
    assert StreamOffset.from_dict(json.loads(json.dumps(offset.to_dict()))) == offset
    assert isinstance(data, dict) and offset.timestamp == data["timestamp"]
