"""Writes `log_format_1.db`: a database file as the release before the log format was versioned
(commit 87dd533) wrote it. Kept with its output so the upgrade test reads a file that release
really wrote; running it again with a newer cdcflow writes the newer format instead.

Usage: python tests/data/make_log_format_1.py
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

from cdcflow import Database

HERE = Path(__file__).parent


def main() -> None:
    path = HERE / "log_format_1.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    db = Database.open(path)
    db.ddl([
        "CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(64), Balance INT64) "
        "PRIMARY KEY (Id)",
        "CREATE CHANGE STREAM Everything FOR ALL OPTIONS (retention_period = '30d', "
        "value_capture_type = 'NEW_ROW_AND_OLD_VALUES')",
    ])
    db.update_table("Accounts", enable_stream=True, expiration_time=timedelta(days=30))
    for i in range(6):
        with db.transaction() as tx:
            tx.insert("Accounts", {"Id": i, "Owner": f"o{i}", "Balance": 100 * i})
    (token,) = [p.token for p in db.partitions("Everything")]
    db.split_partition("Everything", token)
    with db.transaction() as tx:
        tx.update("Accounts", {"Id": 1, "Balance": 7})
        tx.delete("Accounts", {"Id": 2})
    db.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    main()
