"""The fault campaign's workload (`cdcflow.faultkit`): one writer process until a stop file
appears, on the embedded database's workload tables (`testing.WORKLOAD_DDL`) or on the same
two tables in PostgreSQL (`PG_DDL`). Each transaction is either a primary-key update (the row
moves to a new key: on the embedded side a delete and an insert in one transaction, in
PostgreSQL an UPDATE of the key) or 1-5 inserts, whole-row upserts, partial updates and
deletes across Accounts and Ledger. On the embedded side it splits or merges a partition of
the change stream every couple of seconds. The PostgreSQL writer reconnects when the server
goes away (the campaign restarts it); a commit whose outcome it never learnt is not counted.
It paces itself to `rate` transactions per second, and writes how many transactions and row
changes committed to a JSON file."""

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
PG_PASSWORD_ENV = "CDCFLOW_FAULTS_PG_PASSWORD"
"""The PostgreSQL writer (and the campaign's runner and capture workers) read the password
from here."""


PG_DDL = ("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance bigint);"
          "CREATE TABLE ledger (book text, entry int, amount bigint, note text, "
          "PRIMARY KEY (book, entry))")


def main(argv: list[str]) -> None:
    target, stop_file, counts_file, seed, rate = argv
    writer = run_pg_fault_writer if target.startswith("host=") else run_fault_writer
    writer(target, Path(stop_file), Path(counts_file), int(seed), float(rate))


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
        _pace(counts, counts_file, began, rate)
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


def _pace(counts: dict[str, int], counts_file: Path, began: float, rate: float) -> None:
    """Save the counts every 50 transactions, and keep to `rate` transactions per second."""
    if counts["transactions"] % 50 == 0:
        _save(counts_file, counts)
    pause = began + counts["transactions"] / rate - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def _save(path: Path, counts: dict[str, int]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(counts))
    temporary.replace(path)


# ---- PostgreSQL -----------------------------------------------------------------------------

_PG_STATEMENTS = {
    "ledger": "INSERT INTO ledger VALUES (%s, %s, %s, 'n') ON CONFLICT (book, entry) DO UPDATE "
              "SET amount = excluded.amount, note = excluded.note",
    "upsert": "INSERT INTO accounts VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
              "owner = excluded.owner, balance = excluded.balance",
    "update": "UPDATE accounts SET balance = %s WHERE id = %s",
    "delete": "DELETE FROM accounts WHERE id = %s",
    "move": "UPDATE accounts SET id = %s, owner = 'moved' WHERE id = %s",
}


def run_pg_fault_writer(dsn: str, stop_file: Path, counts_file: Path, seed: int,
                        rate: float) -> None:
    """The PostgreSQL writer; the password comes from PG_PASSWORD_ENV."""
    import os

    import psycopg2

    rng = random.Random(seed)
    counts = {"transactions": 0, "changes": 0, "reconnects": 0}
    conn, began = None, time.monotonic()
    while not stop_file.exists():
        try:
            if conn is None or conn.closed:
                conn = psycopg2.connect(dsn, password=os.environ[PG_PASSWORD_ENV],
                                        connect_timeout=5)
            counts["changes"] += _pg_transaction(conn, rng)
            counts["transactions"] += 1
        except psycopg2.Error:  # the server went away (restarted): reconnect after a pause
            counts["reconnects"] += 1
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.2)
        _pace(counts, counts_file, began, rate)
    _save(counts_file, counts)


def _pg_transaction(conn: Any, rng: random.Random) -> int:
    """One transaction, committed; the rows it changed."""
    changed, moved = 0, 0
    with conn.cursor() as cur:
        if rng.random() < 0.1:  # a primary-key update, to a key the mixed changes never use
            old, new = rng.randrange(KEYS), rng.randrange(KEYS, 2 * KEYS)
            cur.execute(_PG_STATEMENTS["delete"], (new,))
            changed += cur.rowcount
            cur.execute(_PG_STATEMENTS["move"], (new, old))
            moved = cur.rowcount
        for _ in range(rng.randint(1, 5) if not moved else 0):
            key, choice = rng.randrange(KEYS), rng.random()
            if choice < 0.2:
                cur.execute(_PG_STATEMENTS["ledger"], (rng.choice("ab"), key,
                                                       rng.randrange(-50, 50)))
            elif choice < 0.55:
                cur.execute(_PG_STATEMENTS["upsert"], (key, rng.choice(["a", "b", None]),
                                                       rng.randrange(1000)))
            elif choice < 0.8:
                cur.execute(_PG_STATEMENTS["update"], (rng.randrange(1000), key))
            else:
                cur.execute(_PG_STATEMENTS["delete"], (key,))
            changed += cur.rowcount
    conn.commit()
    return changed + moved
