"""The embedded commit path (issue 11 goal 3): 5-row upsert transactions with a change stream
on, against the stream off and against plain Python `sqlite3` doing the same upserts.

Aims: on/off >= 0.85 and on/raw sqlite3 >= 0.30, all three measured in the same run (each
mode five times, in turn; each ratio is the median of the attempts' paired ratios). With
the stream on, a commit writes its journal row; the records are rendered when a reader first
reads (`cdcflow.store.journal`), so the bench also times that reader's settle of the whole
run and prints the commits and the settling together against the stream off. The raw
baseline uses the same file settings as cdcflow (WAL, synchronous=NORMAL) and one
transaction per 5 upserts.
`--floor` replays, in plain Python `sqlite3` on a file laid out as cdcflow lays out its own,
the statements a commit issues (meta read, and written only when no journal row records the
commit; the versions lookup, the version inserts, the journal row), with every value made
beforehand: what SQLite alone costs, the WAL frames (pages) each commit writes, and so the
best on/sqlite3 ratio this storage layout allows.
By default every upsert inserts (4,000 transactions of 5 cover the 20,000 keys once); with
`--updates` the table is filled first (untimed), so every upsert updates a row, which with
the stream on also records the row's old values.
Usage: python bench/bench_commit.py [--transactions 4000] [--rows 5] [--attempts 5]
       [--updates] [--profile | --floor]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from cdcflow import Database, PartitionPolicy
from cdcflow.store.sqlite import (
    connect,
    create_row_storage,
    initialise,
    read_meta,
    write_meta,
    write_transaction,
)

TABLE = (
    "CREATE TABLE Orders (Id INT64 NOT NULL, Customer STRING(64), Amount INT64, "
    "Note STRING(MAX)) PRIMARY KEY (Id)"
)
KEYS = 20_000
"""Upserts cycle over this many keys: inserts first, then updates."""
FILL_ROWS = 1_000
"""Rows per transaction of the untimed fill (`--updates`)."""


def row(i: int) -> dict[str, object]:
    return {"Id": i % KEYS, "Customer": f"c{i % 97}", "Amount": i, "Note": "x" * 40}


def run_cdcflow(folder: Path, stream_on: bool, transactions: int, rows: int,
                filled: bool = False) -> tuple[float, float]:
    """(rows/s of the commits, seconds a reader then took to settle the journal they left);
    `filled`: every key is inserted first, untimed (its journal settled)."""
    db = Database.open(str(folder / f"bench-{stream_on}.db"),
                       partition_policy=PartitionPolicy(split_records=50_000))
    db.ddl(TABLE)
    if stream_on:
        db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for first in range(0, KEYS if filled else 0, FILL_ROWS):
        with db.transaction() as tx:
            for key in range(first, min(first + FILL_ROWS, KEYS)):
                tx.insert_or_update("Orders", row(key))
    db.current_timestamp()
    began = time.perf_counter()
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(rows):
                tx.insert_or_update("Orders", row(t * rows + r))
    elapsed = time.perf_counter() - began
    began = time.perf_counter()
    db.current_timestamp()  # what a reader does first: render the journal into the log
    settling = time.perf_counter() - began
    db.close()
    return transactions * rows / elapsed, settling


def run_sqlite(folder: Path, transactions: int, rows: int, filled: bool = False) -> float:
    conn = sqlite3.connect(folder / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE Orders (Id INTEGER PRIMARY KEY, Customer TEXT, Amount INTEGER, "
                 "Note TEXT)")
    upsert = ("INSERT INTO Orders(Id, Customer, Amount, Note) VALUES (?, ?, ?, ?) "
              "ON CONFLICT(Id) DO UPDATE SET Customer = excluded.Customer, "
              "Amount = excluded.Amount, Note = excluded.Note")
    if filled:
        with conn:
            conn.executemany(upsert, [tuple(row(key).values()) for key in range(KEYS)])
    began = time.perf_counter()
    for t in range(transactions):
        conn.execute("BEGIN IMMEDIATE")
        for r in range(rows):
            values = row(t * rows + r)
            conn.execute(upsert, (values["Id"], values["Customer"], values["Amount"],
                                  values["Note"]))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    conn.close()
    return transactions * rows / elapsed


FLOOR_PARTS = (("meta",), ("versions",), ("journal",), ("meta", "versions"),
               ("meta", "versions", "journal"))


def replay_floor(folder: Path, parts: tuple[str, ...], transactions: int, rows: int,
                 checkpoints: bool) -> tuple[float, float]:
    """(microseconds, WAL frames) per commit of the statements in `parts`. With
    `checkpoints`, SQLite copies the WAL back as it does under cdcflow and under the baseline
    (the frames are then not counted: 0)."""
    path = folder / f"floor-{'-'.join(parts)}-{checkpoints}.db"
    conn = connect(str(path))
    initialise(conn)
    with write_transaction(conn):
        create_row_storage(conn, "_rows_1")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if not checkpoints:
        conn.execute("PRAGMA wal_autocheckpoint=0")
    began = time.perf_counter()
    for t in range(transactions):
        with write_transaction(conn):
            replay_commit(conn, parts, t, rows)
    elapsed = time.perf_counter() - began
    frames = 0.0 if checkpoints else os.path.getsize(f"{path}-wal") / (
        conn.execute("PRAGMA page_size").fetchone()[0] + 24) / transactions
    conn.close()
    return elapsed / transactions * 1e6, frames


def replay_commit(conn: sqlite3.Connection, parts: tuple[str, ...], t: int, rows: int) -> None:
    """The statements of commit `t` that `parts` names, with the values cdcflow would bind."""
    micros = 1_000_000 + t
    if "meta" in parts:  # a journaled commit's row holds its time and id: no meta write
        read_meta(conn)
        if "journal" not in parts:
            write_meta(conn, {"last_commit_micros": micros, "txn_counter": t})
    if "versions" in parts:
        keys = [f"[{(t * rows + r) % KEYS}]" for r in range(rows)]
        marks = ",".join("?" * len(keys))
        conn.execute(f"SELECT key, deleted, row, MAX(commit_micros) FROM _rows_1 "
                     f"WHERE key IN ({marks}) GROUP BY key", keys).fetchall()
        conn.executemany(
            "INSERT INTO _rows_1(key, commit_micros, key_hash, deleted, row) VALUES (?,?,?,?,?)",
            [(k, micros, hash(k) & (2**63 - 1), 0, orjson.dumps(row(t * rows + r)).decode())
             for r, k in enumerate(keys)])
    if "journal" in parts:
        entry = orjson.dumps([["Orders", f"[{(t * rows + r) % KEYS}]", 1234567890123,
                               row(t * rows + r - KEYS), row(t * rows + r),
                               ["Customer", "Amount", "Note"]] for r in range(rows)]).decode()
        conn.execute("INSERT INTO _journal(micros, txn, size, changes) VALUES (?, ?, ?, ?)",
                     (micros, str(t), rows, entry))


def print_floor(folder: Path, transactions: int, rows: int) -> None:
    raw = run_sqlite(folder, transactions, rows)
    print(f"SQLite alone, {transactions} commits of {rows} upserts, WAL, checkpoints as usual")
    print(f"  plain sqlite3 upserts (the baseline): {rows / raw * 1e6:6.1f} us a commit")
    for parts in FLOOR_PARTS:
        micros, _ = replay_floor(folder, parts, transactions, rows, checkpoints=True)
        _, frames = replay_floor(folder, parts, transactions, rows, checkpoints=False)
        print(f"  {' + '.join(parts):24s}: {micros:6.1f} us a commit, {frames:.2f} WAL frames")
        if len(parts) == 3:
            print(f"  best on/sqlite3 this layout allows, with no Python at all: "
                  f"{rows / raw * 1e6 / micros:.2f} (aim >= 0.30)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--attempts", type=int, default=5,
                        help="runs of each mode, in turn; the medians are printed")
    parser.add_argument("--updates", action="store_true",
                        help="fill the table first, so that every upsert updates a row")
    parser.add_argument("--profile", action="store_true",
                        help="profile one run with the stream on and print its top entries")
    parser.add_argument("--floor", action="store_true",
                        help="what SQLite alone costs per commit on cdcflow's file layout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.floor:
            print_floor(Path(folder), args.transactions, args.rows)
            return
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(run_cdcflow, Path(folder), True, args.transactions, args.rows)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            return
        results, settles = run_attempts(Path(folder), args)
    print_results(args.transactions, args.rows, results, statistics.median(settles),
                  args.updates)


def run_attempts(folder: Path, args: argparse.Namespace
                 ) -> tuple[dict[str, list[float]], list[float]]:
    """Each mode's rate per attempt (the attempt's three runs one after another, the stream
    off and on in turn first), and each attempt's settling seconds."""
    results: dict[str, list[float]] = {"off": [], "on": [], "raw": []}
    settles: list[float] = []
    shape = (args.transactions, args.rows, args.updates)
    for attempt in range(args.attempts):
        run = folder / str(attempt)
        run.mkdir()
        results["raw"].append(run_sqlite(run, *shape))
        for stream_on in (attempt % 2 == 1, attempt % 2 == 0):
            rate, settling = run_cdcflow(run, stream_on, *shape)
            results["on" if stream_on else "off"].append(rate)
            settles.extend([settling] if stream_on else [])
    return results, settles


def print_results(transactions: int, rows: int, results: dict[str, list[float]],
                  settling: float, updates: bool) -> None:
    """Each mode's median rate; each ratio is the median of the attempts' ratios (an
    attempt's runs are paired: the machine's speed drifts less within one)."""
    off, on, raw = (statistics.median(results[k]) for k in ("off", "on", "raw"))
    paired_on_off = [a / b for a, b in zip(results["on"], results["off"], strict=True)]
    on_off = statistics.median(paired_on_off)
    on_raw = statistics.median(a / b for a, b in zip(results["on"], results["raw"], strict=True))
    total_rows = transactions * rows
    with_settling = total_rows / (total_rows / on + settling)
    kind = "each an update of a row" if updates else f"over {KEYS:,} keys, inserts first"
    print(f"commit path, {transactions} transactions x {rows} upserts ({kind}), "
          f"medians of {len(results['on'])} attempts")
    print(f"  plain sqlite3 (baseline): {raw:,.0f} rows/s")
    print(f"  change stream off       : {off:,.0f} rows/s")
    print(f"  change stream on        : {on:,.0f} rows/s")
    print(f"  ratio on/off            : {on_off:.2f} (aim >= 0.85; attempts "
          f"{', '.join(f'{ratio:.2f}' for ratio in paired_on_off)})")
    print(f"  ratio on/sqlite3        : {on_raw:.2f} (aim >= 0.30)")
    print(f"  a reader then settled the journal (rendered the records) in {settling:.2f} s, "
          f"{settling / transactions * 1e6:.0f} us a commit; commits and settling together: "
          f"{with_settling:,.0f} rows/s, {with_settling / off:.2f} of the stream off")


if __name__ == "__main__":
    main()
