"""Many readers and writers on one embedded database file (issue 14 §4): do the lineage rules
hold, and does any reader stall?

One SQLite file holds WORKLOAD_DDL and `CREATE CHANGE STREAM Everything FOR ALL`, with a
partition policy that also splits and merges by itself. Phase 1, the baseline ("writers
alone"): --writers processes commit random transactions (`run_writer`, in chunks, with a random
pause of 0..--pause s after each) for --warmup-seconds, with no reader and no churn process.
Phase 2, for --minutes: the same writers, one `run_partition_churn` process, and --readers
processes each following the stream live from its start with `follow_change_stream` (CS-4
workflow) up to an end a margin after the writers stop. A reader keeps bounded memory: per
key the running state and a sha256 over its (commit micros, state) sequence; per partition
first-arrival and finish times (monotonic), counts, commit-timestamp and key-hash min/max,
order and heartbeat-promise flags; overall the largest wall-clock gap between two records
(data, heartbeat or child-partitions) it received: the stall figure.

Checks, each printed PASS/FAIL with numbers (exit status 1 if any fails):
  1. history: each reader's per-key digests equal those of `expected_history` of the writers'
     history files (exact history, in order, per key);
  2. partitions: each read once per reader, and every partition starting by the end read;
  3. lineage: a child's first record arrived after every parent's last (its child record);
  4. bounds and order (CS-2/3/8/9): records' key hashes inside their partition's range and
     commit timestamps in [start, end); in order per partition; none at or before a heartbeat;
  5. stalls: no reader went more than STALL_SECONDS without receiving a record.
The ratio printed is phase 2's commit rate over phase 1's (with readers and churn / alone).
Writers are paced, so the ratio shows the cost of readers and churn on top of that pace.

Usage: python bench/bench_concurrency.py [--minutes 10] [--writers 8] [--readers 4]
                                         [--seed 1] [--warmup-seconds 20] [--pause 0.02]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import resource
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cdcflow import Database, PartitionPolicy
from cdcflow.follow import follow_change_stream
from cdcflow.model.partitions import PartitionMetadata
from cdcflow.model.records import ChangeRecord, DataChangeRecord
from cdcflow.model.timestamps import to_micros
from cdcflow.testing import WORKLOAD_DDL, expected_history, run_partition_churn, run_writer

STREAM = "Everything"
POLICY = PartitionPolicy(split_records=150, max_partitions=8, merge_min_age_seconds=0.5,
                         merge_max_records_per_second=40.0, check_interval_seconds=0.2)
STALL_SECONDS = 10.0
HEARTBEAT_MS = 1000
CHUNK_TRANSACTIONS = 50
SPAWN_GRACE_SECONDS = 5.0
END_MARGIN_SECONDS = 15.0


def write_for(path: str, seed: int, begin_at: float, seconds: float, history: str,
              pause: float) -> None:
    """Wait until wall time `begin_at`, then commit random transactions for `seconds`,
    `run_writer` in chunks of CHUNK_TRANSACTIONS, each chunk with its own seed."""
    time.sleep(max(0.0, begin_at - time.time()))
    deadline = begin_at + seconds
    chunk = 0
    while time.time() < deadline:
        run_writer(path, seed * 1_000_000 + chunk, CHUNK_TRANSACTIONS, history,
                   pause_seconds=pause)
        chunk += 1


def key_name(record: DataChangeRecord, keys: dict[str, Any]) -> tuple[str, list[Any]]:
    """The (table, key) identity `expected_history` uses, as one string, and the key parts."""
    parts = [keys[c.name] for c in record.column_types if c.is_primary_key]
    return f"{record.table_name}|{json.dumps(parts, separators=(',', ':'))}", parts


def digest_line(micros: int, state: dict[str, Any] | None) -> bytes:
    return (json.dumps([micros, state], sort_keys=True, separators=(",", ":")) + "\n").encode()


@dataclass
class PartitionSeen:
    """What one reader saw of one partition (times are the reader's time.monotonic())."""

    first: float | None = None
    finished: float | None = None
    records: int = 0
    heartbeats: int = 0
    min_ts: int | None = None
    max_ts: int | None = None
    min_hash: int | None = None
    max_hash: int | None = None
    last_ts: int = -1
    last_heartbeat: int = -1
    out_of_order: int = 0
    at_or_before_heartbeat: int = 0


@dataclass
class KeySeen:
    state: dict[str, Any] | None = None
    changes: int = 0
    digest: Any = field(default_factory=hashlib.sha256)


class LiveReader:
    """The bounded-memory summary of a live follow, fed by `on_record` from reader threads."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.lock = threading.Lock()
        self.keys: dict[str, KeySeen] = {}
        self.partitions: dict[str, PartitionSeen] = {}
        self.began = time.monotonic()
        self.began_micros = int(time.time() * 1_000_000)
        self.last_arrival = self.began
        self.max_gap = 0.0
        self.max_gap_at = 0.0
        self.max_lag = 0.0
        self.records = 0

    def on_record(self, token: str, row: ChangeRecord) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last_arrival > self.max_gap:
                self.max_gap, self.max_gap_at = now - self.last_arrival, now - self.began
            self.last_arrival = now
            seen = self.partitions.setdefault(token, PartitionSeen())
            seen.first = now if seen.first is None else seen.first
            if row.data_change_record is not None:
                self._on_data(seen, row.data_change_record)
            elif row.heartbeat_record is not None:
                seen.heartbeats += 1
                seen.last_heartbeat = to_micros(row.heartbeat_record.timestamp)
            else:
                seen.finished = now

    def _on_data(self, seen: PartitionSeen, record: DataChangeRecord) -> None:
        micros = to_micros(record.commit_timestamp)
        self.records += 1
        seen.records += 1
        seen.out_of_order += micros < seen.last_ts
        seen.at_or_before_heartbeat += micros <= seen.last_heartbeat
        seen.last_ts = max(seen.last_ts, micros)
        seen.min_ts = micros if seen.min_ts is None else min(seen.min_ts, micros)
        seen.max_ts = micros if seen.max_ts is None else max(seen.max_ts, micros)
        if micros >= self.began_micros:
            self.max_lag = max(self.max_lag, time.time() - micros / 1_000_000)
        for mod in record.mods:
            name, parts = key_name(record, mod.keys)
            position = self.database.key_hash(record.table_name, tuple(parts))
            seen.min_hash = position if seen.min_hash is None else min(seen.min_hash, position)
            seen.max_hash = position if seen.max_hash is None else max(seen.max_hash, position)
            key = self.keys.setdefault(name, KeySeen())
            # the replay rule of `observed_history`: partial new values apply onto the state
            if record.mod_type == "DELETE":
                key.state = None
            elif record.mod_type == "INSERT":
                key.state = {**mod.keys, **mod.new_values}
            else:
                key.state = {**(key.state or {}), **mod.keys, **mod.new_values}
            key.changes += 1
            key.digest.update(digest_line(micros, key.state))

    def summary(self, partitions_read: list[str]) -> dict[str, Any]:
        return {
            "records": self.records, "max_gap": self.max_gap, "max_gap_at": self.max_gap_at,
            "max_lag": self.max_lag, "seconds": time.monotonic() - self.began,
            "partitions_read": partitions_read,
            "partitions": {t: asdict(p) for t, p in self.partitions.items()},
            "keys": {n: [k.changes, k.digest.hexdigest()] for n, k in self.keys.items()},
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


def follow_live(path: str, start: datetime, end: datetime, out_file: str) -> None:
    """A reader process: follow the stream from `start` to `end`, write its summary."""
    database = Database.open(path)
    reader = LiveReader(database)
    result = follow_change_stream(database, STREAM, start, end, heartbeat_ms=HEARTBEAT_MS,
                                  on_record=reader.on_record, keep=False)
    Path(out_file).write_text(json.dumps(reader.summary(result.partitions_read)))


def expected_digests(history_files: list[str], end_micros: int) -> dict[str, list[Any]]:
    """Per key: [changes, sha256] over `expected_history` up to the readers' end."""
    digests = {}
    for (table, key), sequence in expected_history(history_files).items():
        digest = hashlib.sha256()
        kept = [(micros, state) for micros, state in sequence if micros <= end_micros]
        for micros, state in kept:
            digest.update(digest_line(micros, state))
        if kept:
            digests[f"{table}|{key}"] = [len(kept), digest.hexdigest()]
    return digests


def history_counts(files: list[str]) -> tuple[int, int]:
    """(committed transactions, row operations) logged in writers' history files."""
    transactions = operations = 0
    for file in files:
        with open(file, encoding="utf-8") as lines:
            for line in lines:
                transactions += 1
                operations += len(json.loads(line)["ops"])
    return transactions, operations


def check_history(summaries: list[dict[str, Any]], expected: dict[str, list[Any]]) -> bool:
    changes = sum(count for count, _ in expected.values())
    ok = True
    for number, summary in enumerate(summaries):
        seen = summary["keys"]
        wrong = [k for k in expected.keys() | seen.keys() if seen.get(k) != expected.get(k)]
        got = sum(count for count, _ in seen.values())
        ok &= not wrong
        print(f"  reader {number}: {len(seen)} keys, {got} changes; expected {len(expected)} "
              f"keys, {changes} changes; keys differing: {len(wrong)} {sorted(wrong)[:5]}")
    return report(ok, "1. exact per-key history (sha256 per key) in every reader")


def check_partitions_read(summaries: list[dict[str, Any]], partitions: list[PartitionMetadata],
                          end: datetime) -> bool:
    due = {p.token for p in partitions if p.start_timestamp <= end}
    ok = True
    for number, summary in enumerate(summaries):
        read = summary["partitions_read"]
        twice = len(read) - len(set(read))
        missing, extra = due - set(read), set(read) - due
        ok &= not (twice or missing or extra)
        print(f"  reader {number}: {len(read)} read, {len(due)} due, twice {twice}, "
              f"missing {len(missing)}, unexpected {len(extra)}")
    return report(ok, "2. each partition read exactly once, all partitions read")


def check_lineage(summaries: list[dict[str, Any]], partitions: list[PartitionMetadata]) -> bool:
    ok = True
    for number, summary in enumerate(summaries):
        seen = summary["partitions"]
        early, checked, slack = 0, 0, float("inf")
        for partition in partitions:
            child = seen.get(partition.token)
            if not partition.parent_tokens or child is None:
                continue
            checked += 1
            ends = [(seen.get(t) or {}).get("finished") for t in partition.parent_tokens]
            last_parent = max(float("inf") if e is None else e for e in ends)
            early += child["first"] < last_parent
            slack = min(slack, child["first"] - last_parent)
        ok &= early == 0
        print(f"  reader {number}: {checked} children checked, {early} read before a parent "
              f"ended; least margin {slack * 1000:.3f} ms")
    return report(ok, "3. children read only after all parents finished")


def bounds_problems(partition: PartitionMetadata, seen: dict[str, Any]) -> int:
    problems = int(seen["out_of_order"] + seen["at_or_before_heartbeat"])
    if seen["min_ts"] is None:
        return problems
    first, last = int(seen["min_ts"]), int(seen["max_ts"])
    problems += first < to_micros(partition.start_timestamp)
    if partition.end_timestamp is not None:
        problems += last >= to_micros(partition.end_timestamp)
    problems += not partition.key_range.contains(seen["min_hash"])
    problems += not partition.key_range.contains(seen["max_hash"])
    return problems


def check_bounds(summaries: list[dict[str, Any]], partitions: list[PartitionMetadata]) -> bool:
    by_token = {p.token: p for p in partitions}
    ok = True
    for number, summary in enumerate(summaries):
        bad = [t for t, seen in summary["partitions"].items()
               if t not in by_token or bounds_problems(by_token[t], seen)]
        ok &= not bad
        print(f"  reader {number}: {len(summary['partitions'])} partitions with records, "
              f"{len(bad)} out of bounds or order {bad[:3]}")
    return report(ok, "4. key range, [start, end), commit order, heartbeat promises")


def check_stalls(summaries: list[dict[str, Any]], finished: list[bool]) -> bool:
    ok = all(finished)
    for number, summary in enumerate(summaries):
        ok &= summary["max_gap"] <= STALL_SECONDS
        print(f"  reader {number}: largest gap {summary['max_gap']:.2f} s at "
              f"{summary['max_gap_at']:.0f} s into its follow")
    print(f"  readers that finished: {sum(finished)} of {len(finished)}")
    return report(ok, f"5. no reader stalled (gap <= {STALL_SECONDS:.0f} s)")


def report(ok: bool, title: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {title}")
    return ok


def start_processes(processes: list[Any]) -> None:
    for process in processes:
        process.start()


def join_all(processes: list[Any], timeout: float) -> list[bool]:
    """Join each; terminate any still running after `timeout` s overall. Clean exits."""
    deadline = time.time() + timeout
    for process in processes:
        process.join(timeout=max(1.0, deadline - time.time()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
    return [process.exitcode == 0 for process in processes]


def writers(context: Any, path: str, args: argparse.Namespace, phase: int, seconds: float,
            folder: Path) -> tuple[list[Any], list[str]]:
    files = [str(folder / f"history-{phase}-{n}.jsonl") for n in range(args.writers)]
    begin_at = time.time() + SPAWN_GRACE_SECONDS
    processes = [context.Process(target=write_for, args=(
        path, args.seed * 100 + phase * 10 + n, begin_at, seconds, files[n], args.pause))
        for n in range(args.writers)]
    return processes, files


def run_alone(context: Any, path: str, args: argparse.Namespace, folder: Path) -> list[str]:
    processes, files = writers(context, path, args, 1, args.warmup_seconds, folder)
    start_processes(processes)
    if not all(join_all(processes, args.warmup_seconds + 120)):
        sys.exit("a writer failed in the warm-up phase")
    return files


def run_busy(context: Any, path: str, args: argparse.Namespace, folder: Path,
             start: datetime) -> tuple[list[str], list[str], list[bool], datetime]:
    seconds = args.minutes * 60
    processes, files = writers(context, path, args, 2, seconds, folder)
    end = datetime.now(UTC) + timedelta(seconds=SPAWN_GRACE_SECONDS + seconds
                                        + END_MARGIN_SECONDS)
    churn = context.Process(target=run_partition_churn,
                            args=(path, STREAM, SPAWN_GRACE_SECONDS + seconds, args.seed))
    outs = [str(folder / f"reader-{n}.json") for n in range(args.readers)]
    readers = [context.Process(target=follow_live, args=(path, start, end, outs[n]))
               for n in range(args.readers)]
    start_processes([*readers, churn, *processes])
    if not all(join_all([*processes, churn], seconds + SPAWN_GRACE_SECONDS + 300)):
        print("FAIL a writer or the churn process did not exit cleanly")
    finished = join_all(readers, END_MARGIN_SECONDS + max(600.0, seconds))
    return files, outs, finished, end


def print_figures(args: argparse.Namespace, alone: list[str], busy: list[str],
                  partitions: list[PartitionMetadata], summaries: list[dict[str, Any]]) -> None:
    seconds = args.minutes * 60
    tx_alone, ops_alone = history_counts(alone)
    tx_busy, ops_busy = history_counts(busy)
    rate_alone, rate_busy = tx_alone / args.warmup_seconds, tx_busy / seconds
    splits = sum(len(p.parent_tokens) == 1 for p in partitions)
    merges = sum(len(p.parent_tokens) == 2 for p in partitions)
    print(f"duration: {seconds:.0f} s with readers and churn, after {args.warmup_seconds:.0f} s "
          f"of writers alone; {args.writers} writers (pause 0..{args.pause} s), "
          f"{args.readers} readers, 1 churn process")
    print(f"writers alone            : {tx_alone} transactions, {ops_alone} row changes, "
          f"{rate_alone:.1f} tx/s, {ops_alone / args.warmup_seconds:.1f} changes/s")
    print(f"with readers and churn   : {tx_busy} transactions, {ops_busy} row changes, "
          f"{rate_busy:.1f} tx/s, {ops_busy / seconds:.1f} changes/s")
    print(f"ratio = with readers / alone: {rate_busy / rate_alone:.2f}")
    print(f"partitions: {len(partitions)} in all, {splits} split children (1 parent), "
          f"{merges} merge children (2 parents), "
          f"{sum(p.state == 'ACTIVE' for p in partitions)} active at the end")
    for number, s in enumerate(summaries):
        print(f"reader {number}: {s['records']} data records, {len(s['partitions_read'])} "
              f"partitions read, max gap {s['max_gap']:.2f} s, max lag {s['max_lag']:.2f} s, "
              f"{s['seconds']:.0f} s, peak RSS {s['peak_rss_mb']:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-seconds", type=float, default=20.0)
    parser.add_argument("--pause", type=float, default=0.02)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as name:
        folder = Path(name)
        path = str(folder / "concurrency.db")
        db = Database.open(path, partition_policy=POLICY)
        db.ddl(WORKLOAD_DDL)
        db.ddl(f"CREATE CHANGE STREAM {STREAM} FOR ALL")
        start = db.partitions(STREAM)[0].start_timestamp
        alone = run_alone(context, path, args, folder)
        busy, outs, finished, end = run_busy(context, path, args, folder, start)
        summaries = [json.loads(Path(o).read_text()) for o, f in zip(outs, finished, strict=True)
                     if f]
        partitions = db.partitions(STREAM)
        print_figures(args, alone, busy, partitions, summaries)
        expected = expected_digests([*alone, *busy], to_micros(end))
        results = [check_history(summaries, expected),
                   check_partitions_read(summaries, partitions, end),
                   check_lineage(summaries, partitions),
                   check_bounds(summaries, partitions),
                   check_stalls(summaries, finished)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
