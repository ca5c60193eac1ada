"""Test and demo helpers: a random workload writer, a partition churner, a lineage-following
reader for both query APIs, and a checker that compares what a reader saw with what committed.

Writers log every committed transaction to a JSONL history file *after* commit; a transaction
that failed (e.g. a delete of a missing row) logs nothing, and must leave nothing in the stream.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from cdcflow.model.records import DataChangeRecord
from cdcflow.model.timestamps import to_micros
from cdcflow.store.database import Database

WORKLOAD_DDL = [
    "CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(64), Balance INT64) PRIMARY KEY (Id)",
    "CREATE TABLE Ledger (Book STRING(16) NOT NULL, Entry INT64 NOT NULL, Amount INT64, "
    "Note STRING(MAX)) PRIMARY KEY (Book, Entry)",
]
KeyState = dict[str, Any] | None


def _random_row(rng: random.Random, table: str, key_space: int) -> dict[str, Any]:
    if table == "Accounts":
        return {
            "Id": rng.randrange(key_space),
            "Owner": rng.choice(["ana", "bo", "cy", None]),
            "Balance": rng.randrange(-1000, 1000),
        }
    return {
        "Book": rng.choice(["a", "b", "c"]),
        "Entry": rng.randrange(key_space // 3 + 1),
        "Amount": rng.randrange(1000),
        "Note": rng.choice(["x", "yy", None]),
    }


def _key_of(table: str, row: dict[str, Any]) -> str:
    parts = [row["Id"]] if table == "Accounts" else [row["Book"], row["Entry"]]
    return json.dumps(parts, separators=(",", ":"))


def run_writer(
    path: str,
    seed: int,
    transactions: int,
    history: str,
    key_space: int = 200,
    pause_seconds: float = 0.0,
) -> None:
    """Commit random transactions (upserts of whole rows, deletes); log the committed ones.
    `pause_seconds` > 0 sleeps a random 0..pause between transactions."""
    rng = random.Random(seed)
    database = Database.open(path)
    with open(history, "a", encoding="utf-8") as log:
        for _ in range(transactions):
            ops: list[list[Any]] = []
            tx = database.transaction()
            for _ in range(rng.randint(1, 6)):
                table = rng.choice(["Accounts", "Accounts", "Ledger"])
                row = _random_row(rng, table, key_space)
                if rng.random() < 0.25:
                    names = ["Id"] if table == "Accounts" else ["Book", "Entry"]
                    key = {k: row[k] for k in names}
                    tx.delete(table, key)
                    ops.append([table, _key_of(table, row), None])
                else:
                    tx.insert_or_update(table, row)
                    ops.append([table, _key_of(table, row), row])
            try:
                stamp = tx.commit()
            except (NotFound, AlreadyExists):
                continue
            log.write(json.dumps({"ts": to_micros(stamp), "ops": ops}) + "\n")
            log.flush()
            if pause_seconds:
                time.sleep(rng.uniform(0, pause_seconds))
    database.close()


def run_mixed_writer(path: str, seed: int, transactions: int, key_space: int = 150) -> None:
    """Random inserts, partial updates (one column) and deletes; failed ones write nothing."""
    rng = random.Random(seed)
    database = Database.open(path)
    for _ in range(transactions):
        tx = database.transaction()
        for _ in range(rng.randint(1, 4)):
            key = rng.randrange(key_space)
            choice = rng.random()
            if choice < 0.4:
                tx.insert_or_update("Accounts", {"Id": key, "Owner": rng.choice(["a", "b"]),
                                                 "Balance": rng.randrange(100)})
            elif choice < 0.6:
                tx.update("Accounts", {"Id": key, "Balance": rng.randrange(100)})
            elif choice < 0.8:
                tx.update("Accounts", {"Id": key, "Owner": rng.choice(["c", None])})
            else:
                tx.delete("Accounts", {"Id": key})
        with contextlib.suppress(NotFound, AlreadyExists):
            tx.commit()
    database.close()


def run_partition_churn(path: str, stream: str, seconds: float, seed: int) -> int:
    """Split and merge random partitions of `stream` for `seconds`; return how many changes."""
    rng = random.Random(seed)
    database = Database.open(path)
    deadline = time.monotonic() + seconds
    changes = 0
    while time.monotonic() < deadline:
        active = [p for p in database.partitions(stream) if p.state == "ACTIVE"]
        try:
            if len(active) < 6 and (len(active) < 2 or rng.random() < 0.6):
                database.split_partition(stream, rng.choice(active).token)
            else:
                ordered = sorted(active, key=lambda p: p.key_range.start)
                index = rng.randrange(len(ordered) - 1)
                database.merge_partitions(stream, [ordered[index].token, ordered[index + 1].token])
            changes += 1
        except (FailedPrecondition, NotFound, InvalidArgument):
            pass
        time.sleep(rng.uniform(0.02, 0.1))
    database.close()
    return changes


def expected_history(history_files: Iterable[str | Path]) -> dict[tuple[str, str], list[Any]]:
    """Per (table, key): the (commit micros, state) sequence that committed, state None = absent.

    Transactions whose net effect on a key is absent -> absent produce no change and are left out.
    """
    transactions: list[dict[str, Any]] = []
    for file in history_files:
        with open(file, encoding="utf-8") as lines:
            transactions.extend(json.loads(line) for line in lines if line.strip())
    transactions.sort(key=lambda t: t["ts"])
    result: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for transaction in transactions:
        net: dict[tuple[str, str], KeyState] = {}
        for table, key, state in transaction["ops"]:
            net[(table, key)] = state
        for ident, state in net.items():
            before = result[ident][-1][1] if result[ident] else None
            if before is None and state is None:
                continue
            result[ident].append((transaction["ts"], state))
    return {k: v for k, v in result.items() if v}


def observed_history(records: Iterable[DataChangeRecord]) -> dict[tuple[str, str], list[Any]]:
    """Per (table, key): replay mods in the order given; partial new values apply onto the
    running state (OLD_AND_NEW_VALUES carries only changed columns)."""
    result: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for record in records:
        for mod in record.mods:
            key_parts = [mod.keys[c.name] for c in record.column_types if c.is_primary_key]
            ident = (record.table_name, json.dumps(key_parts, separators=(",", ":")))
            before = result[ident][-1][1] if result[ident] else None
            if record.mod_type == "DELETE":
                state = None
            elif record.mod_type == "INSERT":
                state = {**mod.keys, **mod.new_values}
            else:
                state = {**(before or {}), **mod.keys, **mod.new_values}
            result[ident].append((to_micros(record.commit_timestamp), state))
    return dict(result)


def transaction_problems(records: Iterable[DataChangeRecord]) -> list[str]:
    """CS-7 bookkeeping: exact record and partition counts, unique increasing sequences."""
    by_transaction: dict[str, list[DataChangeRecord]] = defaultdict(list)
    for record in records:
        by_transaction[record.server_transaction_id].append(record)
    problems = []
    for txn, group in by_transaction.items():
        sequences = [r.record_sequence for r in group]
        if len(set(sequences)) != len(sequences):
            problems.append(f"transaction {txn}: a record_sequence repeats: {sequences}")
        counts = {r.number_of_records_in_transaction for r in group}
        if counts != {len(group)}:
            problems.append(f"transaction {txn}: {len(group)} records but counts say {counts}")
        if len({r.commit_timestamp for r in group}) != 1:
            problems.append(f"transaction {txn}: records disagree on the commit timestamp")
    return problems


def follow_shards(database: Database, stream_id: str, page: int = 50) -> list[DataChangeRecord]:
    """Read every shard through the iterator API (SH-2..7), each only after its parent and the
    parent's sibling are read to their end; stop when finished shards are done and active ones
    are caught up. Returns one single-mod record per row change, in processing order."""
    table = database.describe_stream(stream_id).table_name
    done: set[str] = set()
    out: list[DataChangeRecord] = []
    progress = True
    while progress:
        progress = False
        for shard in database.describe_stream(stream_id).shards:
            parents = {p for p in (shard.parent_id, shard.parent_sibling_id) if p is not None}
            if shard.shard_id in done or not parents <= done:
                continue
            iterator: str | None = database.get_shard_iterator(stream_id, shard.shard_id)
            while iterator is not None:
                records, iterator = database.get_stream_record(iterator, limit=page)
                out.extend(_as_change_record(table, r) for r in records)
                if not records and iterator is not None:
                    break
            done.add(shard.shard_id)
            progress = True
    return out


def _as_change_record(table: str, record: Any) -> DataChangeRecord:
    from cdcflow.model.records import ColumnTypeInfo, Mod
    from cdcflow.model.types import ColumnType

    mod_type = {"PUT_ROW": "INSERT", "UPDATE_ROW": "UPDATE", "DELETE_ROW": "DELETE"}
    keys = [ColumnTypeInfo(k, ColumnType("STRING"), True, i + 1)
            for i, k in enumerate(record.primary_key)]
    return DataChangeRecord(
        record.commit_timestamp, record.record_sequence, record.transaction_id, True, table,
        tuple(keys), (Mod(record.primary_key, record.columns, record.old_columns),),
        mod_type[record.action_type], "OLD_AND_NEW_VALUES", 1, 1,
    )


def records_from_rows(rows: Iterable[Any]) -> list[DataChangeRecord]:
    """Single-mod records from rows of the "cdcflow" Spark source (Row objects or dicts),
    ordered by (commit timestamp, transaction, record sequence, mod index)."""
    from cdcflow.spark.rows import record_from_row

    records = []
    for row in rows:
        data = row.asDict() if hasattr(row, "asDict") else dict(row)
        record = record_from_row(data)
        records.append(((record.commit_timestamp, data["server_transaction_id"],
                         data["record_sequence"], data["mod_index"]), record))
    records.sort(key=lambda pair: pair[0])
    return [record for _, record in records]
