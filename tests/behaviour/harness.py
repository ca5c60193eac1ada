"""Source harnesses for the behaviour suite: each drives one kind of real source the same
way (a schema, transactions, rollbacks, ADD COLUMN, concurrent writer processes) so that
`test_source_behaviour.py` holds every `ChangeSource` to one contract.

A new source adds a harness class here and its name to `HARNESSES`.

The suite's tables: `accounts (id, owner, balance)`, updated at random, and `journal (id,
note)`, where every committed transaction inserts a fresh row that is never changed again, so
a lost transaction shows as a missing journal row and a doubled one as a journal INSERT seen
twice.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
from pathlib import Path
from typing import Any, Protocol

from cdcflow import Database
from cdcflow.errors import AlreadyExists, NotFound

Op = tuple[str, str, dict[str, Any]]
"""(kind, table, values): kind is upsert, update or delete."""


class SourceHarness(Protocol):
    name: str

    def setup(self, folder: Path) -> None: ...

    def object_name(self, table: str) -> str: ...

    def source_profile(self) -> dict[str, Any]: ...

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]: ...

    def commit(self, ops: list[Op]) -> None: ...

    def roll_back(self, ops: list[Op]) -> None: ...

    def add_column(self, table: str, column: str) -> None: ...

    def rows(self, table: str) -> dict[int, dict[str, Any]]: ...

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any: ...


def random_ops(rng: random.Random, journal_id: int) -> list[Op]:
    """One transaction: a journal row, then 1-4 random account changes (some partial)."""
    ops: list[Op] = [("upsert", "journal", {"id": journal_id, "note": f"t{journal_id}"})]
    for _ in range(rng.randint(1, 4)):
        key = rng.randrange(60)
        choice = rng.random()
        if choice < 0.45:
            ops.append(("upsert", "accounts", {"id": key, "owner": rng.choice(["a", "b"]),
                                                "balance": rng.randrange(1000)}))
        elif choice < 0.8:
            ops.append(("update", "accounts", {"id": key, "balance": rng.randrange(1000)}))
        else:
            ops.append(("delete", "accounts", {"id": key}))
    return ops


# ---- the embedded database ------------------------------------------------------------------

EMBEDDED_DDL = [
    "CREATE TABLE accounts (id INT64 NOT NULL, owner STRING(MAX), balance INT64) "
    "PRIMARY KEY (id)",
    "CREATE TABLE journal (id INT64 NOT NULL, note STRING(MAX)) PRIMARY KEY (id)",
    "CREATE CHANGE STREAM changes FOR ALL OPTIONS (value_capture_type = "
    "'OLD_AND_NEW_VALUES')",
]


def _embedded_apply(database: Database, ops: list[Op]) -> Any:
    tx = database.transaction()
    for kind, table, values in ops:
        match kind:
            case "upsert":
                tx.insert_or_update(table, values)
            case "update":
                tx.update(table, values)
            case _:
                tx.delete(table, values)
    return tx


def embedded_writer(path: str, seed: int, transactions: int, first_journal_id: int) -> None:
    """A writer process: random transactions; one touching a missing row writes nothing."""
    rng = random.Random(seed)
    database = Database.open(path)
    for number in range(transactions):
        ops = random_ops(rng, first_journal_id + number)
        with contextlib.suppress(NotFound, AlreadyExists):
            _embedded_apply(database, ops).commit()
    database.close()


class EmbeddedHarness:
    name = "embedded"

    def setup(self, folder: Path) -> None:
        self.path = str(folder / "source.db")
        self.database = Database.open(self.path)
        self.database.ddl(EMBEDDED_DDL)

    def object_name(self, table: str) -> str:
        return table

    def source_profile(self) -> dict[str, Any]:
        return {"kind": "embedded", "database": self.path, "change_stream": "changes"}

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]:
        return [
            ({"kind": "embedded", "database": self.path}, "change_stream"),
            ({"kind": "embedded", "database": 5, "change_stream": "c"}, "database"),
            ({"kind": "embedded", "database": self.path, "change_stream": "c", "x": 1}, "x"),
            ({"kind": "nosuch", "database": self.path}, "'nosuch'"),
        ]

    def commit(self, ops: list[Op]) -> None:
        _embedded_apply(self.database, ops).commit()

    def roll_back(self, ops: list[Op]) -> None:
        with contextlib.suppress(RuntimeError), _embedded_apply(self.database, ops):
            raise RuntimeError("roll back")

    def add_column(self, table: str, column: str) -> None:
        self.database.ddl(f"ALTER TABLE {table} ADD COLUMN {column} STRING(MAX)")

    def rows(self, table: str) -> dict[int, dict[str, Any]]:
        return {r["id"]: r for r in self.database.scan(table)}

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any:
        return multiprocessing.get_context("spawn").Process(
            target=embedded_writer, args=(self.path, seed, transactions, first_journal_id))


HARNESSES: dict[str, type[Any]] = {"embedded": EmbeddedHarness}
