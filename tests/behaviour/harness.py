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
    kill_rounds: int
    """How many random points the SIGKILL test kills at."""
    round_transactions: int
    """How many transactions a writer commits in each of its rounds."""

    def setup(self, folder: Path) -> None: ...

    def object_name(self, table: str) -> str: ...

    def source_profile(self) -> dict[str, Any]: ...

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]: ...

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]: ...

    def commit(self, ops: list[Op]) -> None: ...

    def roll_back(self, ops: list[Op]) -> None: ...

    def add_column(self, table: str, column: str) -> None: ...

    def rows(self, table: str) -> dict[int, dict[str, Any]]: ...

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any: ...

    def close(self) -> None: ...


def random_ops(rng: random.Random, journal_id: int, deletes: bool = True) -> list[Op]:
    """One transaction: a journal row, then 1-4 random account changes (some partial);
    without `deletes`, updates where deletes would be (a watcher cannot see them)."""
    ops: list[Op] = [("upsert", "journal", {"id": journal_id, "note": f"t{journal_id}"})]
    for _ in range(rng.randint(1, 4)):
        key = rng.randrange(60)
        choice = rng.random()
        if choice < 0.45:
            ops.append(("upsert", "accounts", {"id": key, "owner": rng.choice(["a", "b"]),
                                                "balance": rng.randrange(1000)}))
        elif choice < 0.8 or not deletes:
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
    kill_rounds, round_transactions = 8, 400

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

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]:
        missing = str(folder / "nowhere.db")
        return {"kind": "embedded", "database": missing, "change_stream": "c"}, missing

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

    def close(self) -> None:
        self.database.close()


# ---- PostgreSQL -----------------------------------------------------------------------------

POSTGRES_DDL = (
    "CREATE TABLE accounts (id bigint PRIMARY KEY, owner text, balance bigint);"
    "CREATE TABLE journal (id bigint PRIMARY KEY, note text)"
)


def _pg_statements(ops: list[Op]) -> list[tuple[Any, tuple[Any, ...]]]:
    from psycopg2 import sql

    statements = []
    for kind, table, values in ops:
        name, columns = sql.Identifier(table), list(values)
        others = [c for c in columns if c != "id"]
        if kind == "upsert":
            update = sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(
                sql.Identifier(c), sql.Identifier(c)) for c in others)
            query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (id) DO {}").format(
                name, sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(columns)),
                sql.SQL("UPDATE SET {}").format(update) if others else sql.SQL("NOTHING"))
            statements.append((query, tuple(values.values())))
        elif kind == "update":
            query = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(name, sql.SQL(", ").join(
                sql.SQL("{} = %s").format(sql.Identifier(c)) for c in others))
            statements.append((query, (*(values[c] for c in others), values["id"])))
        else:
            statements.append((sql.SQL("DELETE FROM {} WHERE id = %s").format(name),
                               (values["id"],)))
    return statements


def _pg_connect(dsn: str, password: str) -> Any:
    import psycopg2

    return psycopg2.connect(dsn, password=password)


def postgres_writer(dsn: str, password: str, seed: int, transactions: int,
                    first_journal_id: int) -> None:
    from psycopg2 import errors

    rng = random.Random(seed)
    conn = _pg_connect(dsn, password)
    for number in range(transactions):
        statements = _pg_statements(random_ops(rng, first_journal_id + number))
        for _attempt in range(20):  # two writers over 60 keys in random order can deadlock:
            try:                    # PostgreSQL aborts one, which retries, as an app would
                with conn, conn.cursor() as cur:
                    for query, params in statements:
                        cur.execute(query, params)
                break
            except errors.DeadlockDetected:
                continue
        else:
            raise RuntimeError(f"transaction {number} deadlocked 20 times")
    conn.close()


class PostgresHarness:
    name = "postgres"
    kill_rounds, round_transactions = 8, 400

    def setup(self, folder: Path) -> None:
        import os

        from cdcflow.localdb import LocalPostgres

        self.server = LocalPostgres.start()
        self.env = f"CDCFLOW_TEST_PG_{self.server.port}"
        os.environ[self.env] = self.server.password
        self.conn = _pg_connect(self.server.dsn(), self.server.password)
        with self.conn, self.conn.cursor() as cur:
            cur.execute(POSTGRES_DDL)

    def object_name(self, table: str) -> str:
        return f"public.{table}"

    def source_profile(self) -> dict[str, Any]:
        return {"kind": "postgres", "dsn": self.server.dsn(), "password_env": self.env,
                "heartbeat_seconds": 1.0}

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]:
        dsn = self.server.dsn()
        return [
            ({"kind": "postgres"}, "dsn"),
            ({"kind": "postgres", "dsn": dsn + " password=x"}, "holds a password"),
            ({"kind": "postgres", "dsn": "postgresql://cdc:x@127.0.0.1/shop"}, "password"),
            ({"kind": "postgres", "dsn": dsn, "slot": "Bad-Slot"}, "slot"),
            ({"kind": "postgres", "dsn": dsn, "numeric_precision": {"a.b": [10, 2]}},
             "schema.table.column"),
            ({"kind": "postgres", "dsn": dsn, "wat": 1}, "wat"),
        ]

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]:
        from cdcflow.localdb import free_port

        port = free_port()  # nothing listens there
        return ({"kind": "postgres", "dsn": f"host=127.0.0.1 port={port} dbname=shop user=cdc",
                 "password_env": self.env}, f"cannot connect to PostgreSQL at 127.0.0.1:{port}")

    def commit(self, ops: list[Op]) -> None:
        with self.conn, self.conn.cursor() as cur:
            for query, params in _pg_statements(ops):
                cur.execute(query, params)

    def roll_back(self, ops: list[Op]) -> None:
        with self.conn.cursor() as cur:
            for query, params in _pg_statements(ops):
                cur.execute(query, params)
        self.conn.rollback()

    def add_column(self, table: str, column: str) -> None:
        from psycopg2 import sql

        with self.conn, self.conn.cursor() as cur:
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} text").format(
                sql.Identifier(table), sql.Identifier(column)))

    def rows(self, table: str) -> dict[int, dict[str, Any]]:
        from psycopg2 import sql
        from psycopg2.extras import RealDictCursor

        with self.conn, self.conn.cursor(cursor_factory=RealDictCursor) as cur:
            cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            return {r["id"]: dict(r) for r in cur.fetchall()}

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any:
        return multiprocessing.get_context("spawn").Process(
            target=postgres_writer, args=(self.server.dsn(), self.server.password, seed,
                                          transactions, first_journal_id))

    def close(self) -> None:
        self.conn.close()
        self.server.stop()


# ---- MySQL / MariaDB ------------------------------------------------------------------------

MYSQL_DDL = (
    "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner TEXT, balance BIGINT)",
    "CREATE TABLE journal (id BIGINT PRIMARY KEY, note TEXT)",
)
MYSQL_DEADLOCK, MYSQL_LOCK_WAIT = 1213, 1205


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def _mysql_statements(ops: list[Op]) -> list[tuple[str, tuple[Any, ...]]]:
    statements = []
    for kind, table, values in ops:
        name, columns = _quote(table), list(values)
        others = [c for c in columns if c != "id"]
        if kind == "upsert":
            update = ", ".join(f"{_quote(c)} = VALUES({_quote(c)})" for c in others) or \
                "id = id"
            statements.append((
                f"INSERT INTO {name} ({', '.join(map(_quote, columns))}) VALUES "
                f"({', '.join(['%s'] * len(columns))}) ON DUPLICATE KEY UPDATE {update}",
                tuple(values.values())))
        elif kind == "update":
            assignments = ", ".join(f"{_quote(c)} = %s" for c in others)
            statements.append((f"UPDATE {name} SET {assignments} WHERE id = %s",
                               (*(values[c] for c in others), values["id"])))
        else:
            statements.append((f"DELETE FROM {name} WHERE id = %s", (values["id"],)))
    return statements


def _mysql_connect(port: int, password: str) -> Any:
    import pymysql

    return pymysql.connect(host="127.0.0.1", port=port, user="root", password=password,
                           database="shop", autocommit=False, charset="utf8mb4")


def mysql_writer(port: int, password: str, seed: int, transactions: int,
                 first_journal_id: int) -> None:
    import pymysql

    rng = random.Random(seed)
    conn = _mysql_connect(port, password)
    for number in range(transactions):
        statements = _mysql_statements(random_ops(rng, first_journal_id + number))
        for _attempt in range(20):  # two writers over 60 keys can deadlock: InnoDB aborts
            try:                    # one, which retries, as an application would
                with conn.cursor() as cur:
                    for query, params in statements:
                        cur.execute(query, params)
                conn.commit()
                break
            except pymysql.err.OperationalError as error:
                conn.rollback()
                if error.args[0] not in (MYSQL_DEADLOCK, MYSQL_LOCK_WAIT):
                    raise
        else:
            raise RuntimeError(f"transaction {number} deadlocked 20 times")
    conn.close()


class MySqlHarness:
    name = "mysql"
    kill_rounds, round_transactions = 20, 150

    def setup(self, folder: Path) -> None:
        import os

        from cdcflow.localmaria import LocalMariaDB

        self.server = LocalMariaDB.start()
        self.env = f"CDCFLOW_TEST_MYSQL_{self.server.port}"
        os.environ[self.env] = self.server.password
        self.server.sql(*MYSQL_DDL, database="shop")
        self.conn = _mysql_connect(self.server.port, "")

    def object_name(self, table: str) -> str:
        return f"shop.{table}"

    def source_profile(self) -> dict[str, Any]:
        return {"kind": "mysql", "host": "127.0.0.1", "port": self.server.port, "user": "cdc",
                "password_env": self.env, "databases": ["shop"], "heartbeat_seconds": 0.5}

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]:
        good = self.source_profile()
        return [
            ({"kind": "mysql", "user": "cdc", "databases": ["shop"]}, "host"),
            (good | {"databases": []}, "databases"),
            (good | {"port": 70_000}, "port"),
            (good | {"password_env": "not a name"}, "password_env"),
            (good | {"on_position_lost": "sometimes"}, "on_position_lost"),
            (good | {"server_id": 0}, "server_id"),
            (good | {"wat": 1}, "wat"),
        ]

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]:
        from cdcflow.localdb import free_port

        port = free_port()  # nothing listens there
        return (self.source_profile() | {"port": port},
                f"cannot connect to MySQL at 127.0.0.1:{port}")

    def commit(self, ops: list[Op]) -> None:
        with self.conn.cursor() as cur:
            for query, params in _mysql_statements(ops):
                cur.execute(query, params)
        self.conn.commit()

    def roll_back(self, ops: list[Op]) -> None:
        with self.conn.cursor() as cur:
            for query, params in _mysql_statements(ops):
                cur.execute(query, params)
        self.conn.rollback()

    def add_column(self, table: str, column: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(column)} TEXT")

    def rows(self, table: str) -> dict[int, dict[str, Any]]:
        import pymysql.cursors

        self.conn.commit()  # a fresh snapshot for the read below
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT * FROM {_quote(table)}")
            found = {r["id"]: dict(r) for r in cur.fetchall()}
        self.conn.commit()
        return found

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any:
        return multiprocessing.get_context("spawn").Process(
            target=mysql_writer, args=(self.server.port, "", seed, transactions,
                                       first_journal_id))

    def close(self) -> None:
        self.conn.close()
        self.server.stop()


# ---- the polling watcher over the embedded database ------------------------------------------

WATCHED_DDL = [
    "CREATE TABLE accounts (id INT64 NOT NULL, owner STRING(MAX), balance INT64, "
    "LastModified TIMESTAMP OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (id)",
    "CREATE TABLE journal (id INT64 NOT NULL, note STRING(MAX), "
    "LastModified TIMESTAMP OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (id)",
    "CREATE NULL_FILTERED INDEX AccountsByTime ON accounts (LastModified)",  # journal: scans
]


def _stamped(ops: list[Op]) -> list[Op]:
    """Every write sets the commit-timestamp column, as the watcher's tables require."""
    from cdcflow import COMMIT_TIMESTAMP

    return [(kind, table, values if kind == "delete" else
             values | {"LastModified": COMMIT_TIMESTAMP}) for kind, table, values in ops]


def watched_writer(path: str, seed: int, transactions: int, first_journal_id: int) -> None:
    rng = random.Random(seed)
    database = Database.open(path)
    for number in range(transactions):
        ops = _stamped(random_ops(rng, first_journal_id + number, deletes=False))
        with contextlib.suppress(NotFound, AlreadyExists):
            _embedded_apply(database, ops).commit()
    database.close()


class WatcherHarness(EmbeddedHarness):
    """The embedded database polled by the watcher: no hard deletes (polling cannot see
    them), every write stamped with its commit timestamp."""

    name = "watcher"

    def setup(self, folder: Path) -> None:
        self.path = str(folder / "source.db")
        self.database = Database.open(self.path)
        self.database.ddl(WATCHED_DDL)

    def source_profile(self) -> dict[str, Any]:
        return {"kind": "watcher", "target": {"kind": "embedded", "database": self.path},
                "tables": [{"name": t, "commit_timestamp_column": "LastModified"}
                           for t in ("accounts", "journal")],
                "poll_interval_seconds": 0.2, "page_rows": 20}

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]:
        good = self.source_profile()
        return [
            (good | {"tables": []}, "tables"),
            (good | {"target": {"kind": "embedded"}}, "database"),
            (good | {"page_rows": 0}, "page_rows"),
            (good | {"wat": 1}, "wat"),
        ]

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]:
        missing = str(folder / "nowhere.db")
        return self.source_profile() | {"target": {"kind": "embedded",
                                                   "database": missing}}, missing

    def commit(self, ops: list[Op]) -> None:
        _embedded_apply(self.database, _stamped(ops)).commit()

    def roll_back(self, ops: list[Op]) -> None:
        super().roll_back(_stamped(ops))

    def writer(self, seed: int, transactions: int, first_journal_id: int) -> Any:
        return multiprocessing.get_context("spawn").Process(
            target=watched_writer, args=(self.path, seed, transactions, first_journal_id))


# ---- the polling watcher over PostgreSQL ------------------------------------------------------

class PostgresWatcherHarness(PostgresHarness):
    """PostgreSQL tables made watchable by `prepare_table` (a stamp trigger, a partial index
    and a trigger-fed deletes table), so the writers are PostgresHarness's own, hard deletes
    included: the deletes table makes them visible."""

    name = "watcher-postgres"
    kill_rounds, round_transactions = 8, 150

    def setup(self, folder: Path) -> None:
        from cdcflow.capture.watcher.pg_schema import prepare_table

        super().setup(folder)
        self.server.sql("postgres", "GRANT pg_read_all_stats TO cdc")
        for table in ("accounts", "journal"):
            prepare_table(self.conn, f"public.{table}", "ts",
                          deletes_table=f"public.{table}_deletes")
        self.conn.commit()

    def source_profile(self) -> dict[str, Any]:
        return {"kind": "watcher", "target": {"kind": "postgres", "dsn": self.server.dsn(),
                                              "password_env": self.env,
                                              "horizon_margin_seconds": 0.02},  # a snapshot
                # among fast writers: the default 0.2 s leaves every row to the polls
                "tables": [{"name": f"public.{t}", "commit_timestamp_column": "ts",
                            "deletes_table": f"public.{t}_deletes"}
                           for t in ("accounts", "journal")],
                "poll_interval_seconds": 0.2, "page_rows": 20}

    def bad_profiles(self) -> list[tuple[dict[str, Any], str]]:
        good = self.source_profile()
        target = good["target"]
        return [
            (good | {"target": target | {"dsn": target["dsn"] + " password=x"}},
             "holds a password"),
            (good | {"tables": [{"name": "accounts", "commit_timestamp_column": "ts"}]},
             "schema.table"),
            (good | {"target": {"kind": "embedded", "database": "x.db"}}, "deletes_table"),
            (good | {"horizon": 1}, "horizon"),
        ]

    def unreachable_profile(self, folder: Path) -> tuple[dict[str, Any], str]:
        from cdcflow.localdb import free_port

        port = free_port()  # nothing listens there
        dsn = f"host=127.0.0.1 port={port} dbname=shop user=cdc"
        return (self.source_profile() | {"target": {"kind": "postgres", "dsn": dsn,
                                                    "password_env": self.env}},
                f"cannot connect to PostgreSQL at 127.0.0.1:{port}")


HARNESSES: dict[str, type[Any]] = {"embedded": EmbeddedHarness, "postgres": PostgresHarness,
                                   "mysql": MySqlHarness, "watcher": WatcherHarness,
                                   "watcher-postgres": PostgresWatcherHarness}
