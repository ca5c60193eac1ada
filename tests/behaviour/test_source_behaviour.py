"""The behaviour every `ChangeSource` must show, run against each real source in
`harness.HARNESSES` (the way pyiceberg's catalog behaviour tests run over catalogs):

- backfill plus CDC under concurrent writers: no gap, no duplicate in effect;
- SIGKILL of whatever puts changes into the log (a capture worker; for the embedded database,
  the committing process) at many random points, then a restart that resumes exactly;
- rolled-back transactions never appear;
- ADD COLUMN mid-stream;
- bad definitions give typed errors.

A consumer's view is rebuilt from the source's snapshot and the change log read from
`cdc_start` (lineage-following, CS-4), and compared with the source itself.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcflow.capture.source import ChangeSource, SourceObject
from cdcflow.errors import CdcflowError, InvalidArgument
from cdcflow.follow import follow_change_stream
from cdcflow.store.changelog import open_log
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.lease import stat_fields
from cdcflow.streams.sources import open_source
from cdcflow.streams.workers import run_capture
from tests.behaviour.harness import HARNESSES, SourceHarness

pytestmark = pytest.mark.integration
MARKER = 10**9


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SourceHarness]:
    made: SourceHarness = HARNESSES[request.param]()
    made.setup(tmp_path)
    yield made
    made.close()


def definition_of(harness: SourceHarness, tmp_path: Path) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": "behaviour", "source": harness.source_profile(),
        "include": [harness.object_name("accounts"), harness.object_name("journal")],
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]})


class Consumer:
    """What a destination builds: the snapshot's rows, then every change in log order."""

    def __init__(self, harness: SourceHarness) -> None:
        self.names = {harness.object_name(t): t for t in ("accounts", "journal")}
        self.tables: dict[str, dict[Any, dict[str, Any]]] = defaultdict(dict)
        self.backfilled_journal: set[int] = set()
        self.journal_inserts: Counter[int] = Counter()

    def backfill(self, item: SourceObject, rows: list[dict[str, Any]], after: Any) -> None:
        table = self.names[item.name]
        for row in rows:
            self.tables[table][row["id"]] = dict(row)
            if table == "journal":
                self.backfilled_journal.add(row["id"])

    def read_log(self, source: ChangeSource, start: Any) -> None:
        path, stream = source.log_location()
        log = open_log(path)
        records = follow_change_stream(log, stream, start, log.current_timestamp()).records
        records.sort(key=lambda r: (r.commit_timestamp, int(r.record_sequence)))
        for record in records:
            table = self.names.get(record.table_name)
            if table is not None:
                self._apply(table, record)

    def _apply(self, table: str, record: Any) -> None:
        for keys, new, _old in record.decoded_mods():
            key = keys["id"]
            if record.mod_type == "DELETE":
                self.tables[table].pop(key, None)
                continue
            base = {} if record.mod_type == "INSERT" else self.tables[table].get(key, {})
            self.tables[table][key] = base | new | keys
            if table == "journal":  # never changed again: one INSERT (an UPDATE when polled)
                self.journal_inserts[key] += 1


def start_capture(source: ChangeSource, definition: StreamDefinition, home: Path) -> Any:
    """A capture worker process for a source that has one (None otherwise)."""
    if not source.has_worker:
        return None
    process = multiprocessing.get_context("spawn").Process(
        target=run_capture, args=(definition.model_dump_json(), str(home / "catalog.db")))
    process.start()
    return process


def wait_for_marker(harness: SourceHarness, source: ChangeSource, seconds: float = 120) -> None:
    """Commit a marker transaction and wait until the change log holds it."""
    harness.commit([("upsert", "journal", {"id": MARKER, "note": "marker"})])
    path, stream = source.log_location()
    deadline = time.monotonic() + seconds
    while True:
        log = open_log(path)
        start = log.earliest_readable(stream)
        records = follow_change_stream(log, stream, start, log.current_timestamp()).records
        if any(m.keys.get("id") == MARKER for r in records for m in r.mods):
            return
        assert time.monotonic() < deadline, "the marker never reached the change log"
        time.sleep(0.2)


def verify(harness: SourceHarness, consumer: Consumer) -> None:
    for table in ("accounts", "journal"):
        source = harness.rows(table)
        columns = {c for row in source.values() for c in row}
        seen = {k: {c: row.get(c) for c in columns} for k, row in consumer.tables[table].items()}
        assert seen == source, f"{table} differs from its source"
    doubled = sorted(k for k, n in consumer.journal_inserts.items() if n > 1)
    assert doubled == [], "a transaction appears twice in the log"
    both = sorted(set(consumer.journal_inserts) & consumer.backfilled_journal)
    assert both == [], "a change is in the snapshot and in the log"


def snapshot_and_capture(source: ChangeSource, definition: StreamDefinition,
                         home: Path) -> tuple[Any, Any, list[SourceObject]]:
    """The snapshot (setting up capture from it), then the capture worker if any."""
    objects = [o for o in source.discover() if definition.selects(o.name)]
    snapshot = source.snapshot(objects, None)
    return snapshot, start_capture(source, definition, home), objects


def backfill(source: ChangeSource, consumer: Consumer, snapshot: Any,
             objects: list[SourceObject]) -> None:
    source.backfill(snapshot, objects, consumer.backfill)
    source.release(snapshot)


def test_backfill_and_cdc_hand_off_under_concurrent_writers(harness: SourceHarness,
                                                            tmp_path: Path):
    definition = definition_of(harness, tmp_path)
    source = open_source(definition, tmp_path / "home")
    writers = [harness.writer(seed, 150, seed * 100_000) for seed in (1, 2)]
    for writer in writers:
        writer.start()
    deadline = time.monotonic() + 120
    while len(harness.rows("journal")) < 30:  # the snapshot lands among the writes
        assert time.monotonic() < deadline
        time.sleep(0.02)
    consumer = Consumer(harness)
    snapshot, capture, objects = snapshot_and_capture(source, definition, tmp_path / "home")
    backfill(source, consumer, snapshot, objects)
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    wait_for_marker(harness, source)
    consumer.read_log(source, snapshot.cdc_start)
    if capture is not None:
        capture.terminate()
    verify(harness, consumer)
    assert consumer.backfilled_journal and consumer.journal_inserts  # both sides took part


def test_killed_at_random_points_then_resumed_loses_and_doubles_nothing(
        harness: SourceHarness, tmp_path: Path):
    """SIGKILL at random points (8, or the harness's `kill_rounds`: 20 for MySQL): a capture
    worker where the source has one; the embedded database's commits write their own change
    records, so there the committing process. A point is drawn among the first 40 changes of
    the round in the log, so a capture worker is killed while it captures, not while it
    starts. A writer can finish its round before the poll sees its point (a CI rehearsal's
    did, and was reaped, so the kill found no process): that round has no kill, and more
    than half the rounds must have one."""
    definition = definition_of(harness, tmp_path)
    home = tmp_path / "home"
    source = open_source(definition, home)
    consumer = Consumer(harness)
    snapshot, capture, objects = snapshot_and_capture(source, definition, home)
    backfill(source, consumer, snapshot, objects)
    rng = random.Random(5)
    helpers_seen = kills = 0
    log_path, stream = source.log_location()
    for round_number in range(harness.kill_rounds):
        writer = harness.writer(round_number + 10, harness.round_transactions,
                                (round_number + 1) * 100_000)
        round_start = open_log(log_path).current_timestamp()
        writer.start()
        wanted = rng.randint(1, 40)  # a random point while changes flow into the log
        deadline = time.monotonic() + 120
        while logged_since(log_path, stream, round_start) < wanted and (
                capture is not None or writer.is_alive()):
            assert capture is None or capture.is_alive(), "the capture worker died"
            assert time.monotonic() < deadline, "the round's changes never reached the log"
            time.sleep(rng.uniform(0, 0.05))
        victim = capture if capture is not None else writer
        helpers = children_of(victim.pid)
        helpers_seen += len(helpers)
        try:
            os.kill(victim.pid, signal.SIGKILL)
            kills += 1
        except ProcessLookupError:  # a writer that ended before its point: no kill this round
            assert victim is writer, "the capture worker ended by itself"
        victim.join()
        wait_ended(helpers)
        if capture is not None:
            writer.join(timeout=300)
            capture = start_capture(source, definition, home)
    wait_for_marker(harness, source)
    consumer.read_log(source, snapshot.cdc_start)
    if capture is not None:
        capture.terminate()
    verify(harness, consumer)
    assert len(consumer.journal_inserts) > 20
    assert kills > harness.kill_rounds // 2, f"only {kills} kills landed"
    if harness.name == "mysql":  # its capture reads the binlog in a reader process
        assert helpers_seen > 0, "no binlog reader process was seen under the capture"


def logged_since(path: str, stream: str, start: Any) -> int:
    """Mods the change log holds after `start`."""
    log = open_log(path)
    records = follow_change_stream(log, stream, start, log.current_timestamp(),
                                   workers=1).records
    return sum(len(r.mods) for r in records)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def wait_ended(pids: list[int], seconds: float = 10) -> None:
    """A killed capture takes its helper processes with it (a binlog reader left behind
    would go on as a second replica with the capture's server id)."""
    deadline = time.monotonic() + seconds
    while left := [p for p in pids if (stat_fields(p) or ["X"])[0] not in "ZX"]:
        assert time.monotonic() < deadline, f"processes {left} outlived their killed capture"
        time.sleep(0.05)


def test_rolled_back_transactions_never_appear(harness: SourceHarness, tmp_path: Path):
    definition = definition_of(harness, tmp_path)
    source = open_source(definition, tmp_path / "home")
    consumer = Consumer(harness)
    harness.commit([("upsert", "accounts", {"id": 1, "owner": "a", "balance": 10})])
    snapshot, capture, objects = snapshot_and_capture(source, definition, tmp_path / "home")
    backfill(source, consumer, snapshot, objects)
    harness.roll_back([("upsert", "journal", {"id": 7, "note": "never"}),
                       ("update", "accounts", {"id": 1, "balance": 99}),
                       ("upsert", "accounts", {"id": 2, "owner": "x", "balance": 1})])
    harness.commit([("upsert", "journal", {"id": 8, "note": "kept"})])
    wait_for_marker(harness, source)
    consumer.read_log(source, snapshot.cdc_start)
    if capture is not None:
        capture.terminate()
    verify(harness, consumer)
    assert 7 not in consumer.tables["journal"] and 8 in consumer.tables["journal"]
    assert consumer.tables["accounts"][1]["balance"] == 10 and 2 not in consumer.tables[
        "accounts"]


def test_add_column_mid_stream(harness: SourceHarness, tmp_path: Path):
    definition = definition_of(harness, tmp_path)
    source = open_source(definition, tmp_path / "home")
    consumer = Consumer(harness)
    harness.commit([("upsert", "accounts", {"id": i, "owner": "a", "balance": i})
                    for i in range(5)])
    snapshot, capture, objects = snapshot_and_capture(source, definition, tmp_path / "home")
    backfill(source, consumer, snapshot, objects)
    harness.commit([("update", "accounts", {"id": 1, "balance": 100})])
    harness.add_column("accounts", "nickname")
    harness.commit([("upsert", "accounts", {"id": 9, "owner": "n", "balance": 9,
                                            "nickname": "nine"}),
                    ("update", "accounts", {"id": 2, "nickname": "two"})])
    wait_for_marker(harness, source)
    consumer.read_log(source, snapshot.cdc_start)
    if capture is not None:
        capture.terminate()
    verify(harness, consumer)
    assert consumer.tables["accounts"][9]["nickname"] == "nine"
    assert consumer.tables["accounts"][2]["nickname"] == "two"
    objects = {o.name: o for o in source.discover()}
    assert "nickname" in [c.name for c in objects[harness.object_name("accounts")].columns]


def test_bad_definitions_give_typed_errors(harness: SourceHarness, tmp_path: Path):
    for profile, needle in harness.bad_profiles():
        with pytest.raises(InvalidArgument) as raised:
            StreamDefinition.parse({"name": "s", "source": profile,
                                    "destinations": [{"kind": "event_files", "root": "e"}]})
        assert needle in str(raised.value), (profile, str(raised.value))
    profile, needle = harness.unreachable_profile(tmp_path)
    definition = StreamDefinition.parse({"name": "s", "source": profile,
                                         "destinations": [{"kind": "event_files", "root": "e"}]})
    with pytest.raises(CdcflowError) as raised:
        open_source(definition, tmp_path / "home").discover()
    assert needle in str(raised.value)
