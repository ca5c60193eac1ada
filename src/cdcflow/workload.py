"""A realistic workload for demos and benchmarks: singers and account transfers.

`run_workload` commits at a target rate for a duration: inserts, updates and deletes of singers,
new accounts, and transfers that update two accounts in one transaction (often across
partitions, as in the seed's CS-7 example).
"""

from __future__ import annotations

import random
import time
from datetime import date

from cdcflow.errors import AlreadyExists, NotFound
from cdcflow.model.types import COMMIT_TIMESTAMP
from cdcflow.store.database import Database

DEMO_DDL = [
    "CREATE TABLE Singers (SingerId INT64 NOT NULL, FirstName STRING(1024), "
    "LastName STRING(1024), SingerInfo BYTES(MAX), BirthDate DATE) PRIMARY KEY (SingerId)",
    "CREATE TABLE AccountBalance (AccountId STRING(MAX) NOT NULL, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp = true), Balance INT64) "
    "PRIMARY KEY (AccountId)",
]
_NAMES = ["Marc", "Catalina", "Alice", "Lea", "David", "Kim", "Ana", "Tal", "Lee", "Izumi"]


def _one_transaction(database: Database, rng: random.Random, accounts: int) -> None:
    choice = rng.random()
    with database.transaction() as tx:
        if choice < 0.45:
            source, target = rng.sample(range(accounts), 2)
            amount = rng.randrange(1, 100)
            for account, delta in ((source, -amount), (target, amount)):
                row = database.read_row("AccountBalance", f"Id{account}")
                balance = 1_000 if row is None else int(row["Balance"] or 0)
                tx.insert_or_update("AccountBalance", {
                    "AccountId": f"Id{account}", "Balance": balance + delta,
                    "LastUpdate": COMMIT_TIMESTAMP,
                })
        elif choice < 0.75:
            tx.insert_or_update("Singers", {
                "SingerId": rng.randrange(500),
                "FirstName": rng.choice(_NAMES),
                "LastName": rng.choice(_NAMES),
                "SingerInfo": rng.randbytes(8),
                "BirthDate": date(1950 + rng.randrange(50), 1 + rng.randrange(12), 1),
            })
        elif choice < 0.9:
            tx.update("Singers", {"SingerId": rng.randrange(500), "LastName": None})
        else:
            tx.delete("Singers", {"SingerId": rng.randrange(500)})


def run_workload(
    path: str, seconds: float, rate: float = 50.0, seed: int = 1, accounts: int = 40
) -> int:
    """Commit about `rate` transactions per second for `seconds`; return how many committed."""
    rng = random.Random(seed)
    database = Database.open(path)
    deadline = time.monotonic() + seconds
    committed = 0
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        try:
            _one_transaction(database, rng, accounts)
            committed += 1
        except (NotFound, AlreadyExists):
            pass  # an update or delete of a singer that is not there: nothing was written
        next_at += 1.0 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    database.close()
    return committed
