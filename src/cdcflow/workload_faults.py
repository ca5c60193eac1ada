"""The fault campaign's workload (`cdcflow.faultkit`): one writer process on the embedded
database's workload tables (`testing.WORKLOAD_DDL`) until a stop file appears. Each
transaction is either a primary-key update (the row moves to a new key: a delete and an
insert in one transaction) or 1-5 inserts, whole-row upserts, partial updates and deletes
across Accounts and Ledger. Every couple of seconds it splits or merges a partition of the
change stream. It paces itself to `rate` transactions per second, and writes how many
transactions and row changes committed to a JSON file."""

from __future__ import annotations

import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from cdcflow.store.database import Database

KEYS = 400


def main(argv: list[str]) -> None:
    path, stop_file, counts_file, seed, rate = argv
    run_fault_writer(path, Path(stop_file), Path(counts_file), int(seed), float(rate))


def run_fault_writer(path: str, stop_file: Path, counts_file: Path, seed: int,
                     rate: float) -> None:
    rng = random.Random(seed)
    database = Database.open(path)
    live: set[int] = set()
    counts = {"transactions": 0, "changes": 0, "partition_changes": 0}
    began, churned = time.monotonic(), time.monotonic()
    while not stop_file.exists():
        tx = database.transaction()
        ops = _move_key(tx, rng, live) if live and rng.random() < 0.1 else \
            _mixed(tx, rng, live)
        with contextlib.suppress(NotFound, AlreadyExists):
            tx.commit()
            counts["transactions"] += 1
            counts["changes"] += len(ops)
            for key, present in ops:
                (live.add if present else live.discard)(key)
        if time.monotonic() - churned > 2:
            counts["partition_changes"] += _churn(database, rng)
            churned = time.monotonic()
        if counts["transactions"] % 50 == 0:
            _save(counts_file, counts)
        pause = began + counts["transactions"] / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    _save(counts_file, counts)
    database.close()


def _mixed(tx: Any, rng: random.Random, live: set[int]) -> list[tuple[int, bool]]:
    """1-5 changes; (Accounts key, present after) for each Accounts change."""
    ops: list[tuple[int, bool]] = []
    for _ in range(rng.randint(1, 5)):
        key, choice = rng.randrange(KEYS), rng.random()
        if choice < 0.2:
            tx.insert_or_update("Ledger", {"Book": rng.choice(["a", "b"]), "Entry": key,
                                           "Amount": rng.randrange(-50, 50), "Note": "n"})
            ops.append((-1, True))
        elif choice < 0.55:
            tx.insert_or_update("Accounts", {"Id": key, "Owner": rng.choice(["a", "b", None]),
                                             "Balance": rng.randrange(1000)})
            ops.append((key, True))
        elif choice < 0.8 and key in live:
            tx.update("Accounts", {"Id": key, "Balance": rng.randrange(1000)})
            ops.append((key, True))
        else:
            tx.delete("Accounts", {"Id": key})
            ops.append((key, False))
    return [(k, p) for k, p in ops]


def _move_key(tx: Any, rng: random.Random, live: set[int]) -> list[tuple[int, bool]]:
    """A primary-key update: the row leaves its key for a free one."""
    old = rng.choice(sorted(live))
    new = rng.choice(sorted(set(range(KEYS)) - live) or [old])
    tx.delete("Accounts", {"Id": old})
    tx.insert("Accounts", {"Id": new, "Owner": "moved", "Balance": old})
    return [(old, False), (new, True)]


def _churn(database: Database, rng: random.Random) -> int:
    active = [p for p in database.partitions("Everything") if p.state == "ACTIVE"]
    try:
        if len(active) < 4 and (len(active) < 2 or rng.random() < 0.6):
            database.split_partition("Everything", rng.choice(active).token)
        else:
            ordered = sorted(active, key=lambda p: p.key_range.start)
            index = rng.randrange(len(ordered) - 1)
            database.merge_partitions("Everything", [ordered[index].token,
                                                     ordered[index + 1].token])
        return 1
    except (FailedPrecondition, NotFound, InvalidArgument):
        return 0


def _save(path: Path, counts: dict[str, int]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(counts))
    temporary.replace(path)
