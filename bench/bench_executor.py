"""Where an executor's CPU goes per change, on pgbench's changes from PostgreSQL (issue 11,
goal 2: the pipeline's CPU per change is what caps a drain on two cores).

All in one process, no Spark: pgbench runs for --seconds against a throwaway server with a
slot; the capture writes its changes to a log. Then one batch, the last --cut-th of the log
since its last partition split, read from the partitions that stand at its end (laid out in
shares by whole partitions as a steady drain lays them out, `keyed_batch.slice_owners`, when
they balance), is done share by share, as a keyed task does it (`pipeline._share_work`):
read the mods, fold them onto the CDC tables' rows, build the events, make the pending rows,
write event files and pending files. Reading, folding and building events are each timed
alone too, over every share (process time, best of --repeats); all is set against the
baseline, a plain Python loop that reads the same log entries and parses their bodies, in
the same run.
Usage: python bench/bench_executor.py [--seconds 20] [--cut 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.events.files import Rotation
from cdcflow.model.events import change_of_row, event_of_change
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.spark.keyed_batch import mods_of_share, slice_owners
from cdcflow.spark.pipeline import BatchPlan, BatchWork, EventsPlan, _share_work
from cdcflow.spark.reading import ChangeSlice, slice_parts
from cdcflow.store.changelog import open_log
from cdcflow.streams.setup import table_schema
from cdcflow.table import CdcTable
from cdcflow.table.fold import fold_mods
from pgkit import CaptureThread, capture_source, create_slot, pgbench, start_server

SHARES = 2


def captured_log(folder: Path, seconds: int) -> tuple[str, list[Any]]:
    """pgbench's changes captured into folder/log.db; the label and objects of the source."""
    server = start_server(synchronous_commit=False)
    try:
        pgbench(server, "-i", "-q", "-s", "10")
        source = capture_source(server, folder)
        create_slot(source)
        pgbench(server, "-c", "4", "-j", "2", "-T", str(seconds))
        capture = CaptureThread(source).start()
        try:
            capture.wait_for(source.mark(), 3600)
        finally:
            capture.stop()
        objects = [o for o in source.discover() if source.config.selects(o.name)]
        return source.log_location()[0], objects
    finally:
        server.stop()


def last_slices(log_path: str, cut: int) -> tuple[list[ChangeSlice], list[int]]:
    """The slices of the partitions standing at the log's end over its last cut-th (from the
    last split on at most), and their mods."""
    log = open_log(log_path)
    active = [p for p in log.partitions("changes") if p.end_timestamp is None]
    after = max(to_micros(p.start_timestamp) for p in active)
    until = to_micros(log.current_timestamp())
    after = max(after, until - (until - after) // cut)
    pieces = [ChangeSlice(log_path, "changes", p.token, after, until, None, 1000, False)
              for p in active]
    counts = [log.log_mod_total("changes", p.token, from_micros(after), from_micros(until))
              for p in pieces]
    return pieces, counts


def best_of(repeats: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """The least process time of `work` over `repeats` runs (the collector paused, as in a
    task), and its last result."""
    best, result = float("inf"), None
    gc.disable()
    try:
        for _ in range(repeats):
            began = time.process_time()
            result = work()
            best = min(best, time.process_time() - began)
    finally:
        gc.enable()
    return best, result


def plain_read(pieces: list[ChangeSlice]) -> int:
    """The baseline: the log entries of the slices, their bodies parsed; how many."""
    count = 0
    for piece in pieces:
        for _kind, _micros, record, _types in slice_parts(piece):
            count += len(record.get("mods", ()))
    return count


def phases(plan: BatchPlan, pieces: list[ChangeSlice], owners: dict[str, int] | None,
           repeats: int) -> dict[str, float]:
    """Seconds of each phase alone, summed over the shares: read, fold, events."""
    tables = {name: CdcTable.open(root) for name, root in plan.tables.items()}
    schemas = {name: table.schema for name, table in tables.items()}
    now = SYSTEM_CLOCK.now()
    totals = {"read": 0.0, "fold": 0.0, "events": 0.0}
    for share in range(SHARES):
        read, mods = best_of(repeats, lambda s=share: mods_of_share(pieces, s, SHARES, owners))
        fold, folded = best_of(repeats, lambda m=mods: fold_mods(dict(tables), m, schemas))
        events, _ = best_of(repeats, lambda f=folded: [
            event_of_change(plan.stream, plan.source_label, change_of_row(mod), row, now)
            for item in f for mod, row in zip(item.mods, item.rows, strict=True)])
        for phase, seconds in (("read", read), ("fold", fold), ("events", events)):
            totals[phase] += seconds
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--cut", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        label, objects = captured_log(folder, args.seconds)
        tables = {o.name: str(CdcTable.ensure(folder / "warehouse" / o.name, table_schema(o),
                                              list(o.primary_key)).root.resolve())
                  for o in objects if o.primary_key}
        plan = BatchPlan("executor", label, tuple(o.name for o in objects), tables,
                         "stream:executor", EventsPlan(str(folder / "events"), "json",
                                                        Rotation()))
        pieces, counts = last_slices(str(folder / "log.db"), args.cut)
        owners = slice_owners(pieces, counts, SHARES)
        work = BatchWork(1, True, True, SYSTEM_CLOCK.now(), f"keyed{SHARES}")
        baseline, total = best_of(args.repeats, lambda: plain_read(pieces))
        whole, _ = best_of(args.repeats, lambda: [
            _share_work(plan, work, share, SHARES, pieces, owners) for share in range(SHARES)])
        parts = phases(plan, pieces, owners, args.repeats)
    report(args, total, baseline, whole, parts, owners is not None)


def report(args: argparse.Namespace, total: int, baseline: float, whole: float,
           parts: dict[str, float], by_partition: bool) -> None:
    per = whole / total * 1e6
    print(f"pgbench -c 4 -T {args.seconds} captured; 1/{args.cut} of the log since its last "
          f"split: {total:,} changes in {SHARES} shares "
          f"({'by whole partitions' if by_partition else 'by key hash'}), best of "
          f"{args.repeats}, process time")
    print(f"  plain read of the log (baseline): {baseline / total * 1e6:6.1f} us/change")
    print(f"  a keyed task's whole work       : {per:6.1f} us/change "
          f"({total / whole:,.0f} changes/s on one core, {2 * total / whole:,.0f} on two); "
          f"{per / (baseline / total * 1e6):.1f}x the plain read")
    for phase in ("read", "fold", "events"):
        print(f"    {phase:<6} (each phase alone)   : {parts[phase] / total * 1e6:6.1f} us/change")
    rest = (whole - sum(parts.values())) / total * 1e6
    print(f"    the rest: pending rows, encoding and writing the files, opening the tables: "
          f"{rest:.1f} us/change")


if __name__ == "__main__":
    main()
