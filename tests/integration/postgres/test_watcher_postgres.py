"""The polling change watcher on a real PostgreSQL server (issue 13's second target, CW-1..7):
schema helpers that need no change to the writing application, the horizon from
pg_stat_activity, late commits, the partial index in the plan, Processed, the trigger-fed
deletes table, cleanup under a concurrent writer, and hostile identifiers everywhere."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from cdcflow.capture.watcher.config import PostgresTargetConfig, WatchedTable
from cdcflow.capture.watcher.pg_schema import prepare_table, qualified
from cdcflow.capture.watcher.postgres import PostgresTarget
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound
from cdcflow.follow import follow_change_stream
from cdcflow.localdb import LocalPostgres
from cdcflow.store.changelog import open_log
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source
from tests.integration.watcher.test_watcher_embedded import start_worker

pytestmark = pytest.mark.integration
TABLE = 'public.Sing"ers; DROP TABLE sentinel; --'
DELETES = 'public.del"etes of; singers'
ID, FIRST, STAMP = "Singer Id", 'First";Name', 'Last "Modified"; --'
SHARD, PROCESSED = "Shard Id;", "Pro'cessed"
SHARDS = {"in": [-3, -2, -1, 0, 1, 2, 3]}


@pytest.fixture(scope="module", autouse=True)
def the_role_sees_transaction_starts(pg: LocalPostgres) -> None:
    """What the watcher's role needs (README), for every test here, run alone or not."""
    pg.sql("postgres", "GRANT pg_read_all_stats TO cdc")


@pytest.fixture(scope="module")
def watched(pg: LocalPostgres) -> str:
    """The app's table, made watchable by `prepare_table` (run twice: it changes nothing)."""
    conn = connect(pg)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE sentinel (x int)")
        cur.execute(sql.SQL("CREATE TABLE {} ({} bigint PRIMARY KEY, {} text)").format(
            qualified(TABLE), sql.Identifier(ID), sql.Identifier(FIRST)))
    for _ in range(2):
        prepare_table(conn, TABLE, STAMP, shard_column=SHARD, shards=4,
                      processed_column=PROCESSED, deletes_table=DELETES)
    conn.close()
    return TABLE


def connect(pg: LocalPostgres) -> Any:
    conn = psycopg2.connect(pg.dsn(), password=pg.password)
    conn.autocommit = True
    return conn


def upsert(cur: Any, number: int, first: str) -> None:
    """What the application writes: it knows nothing of the watcher's columns."""
    cur.execute(sql.SQL("INSERT INTO {} ({}, {}) VALUES (%s, %s) ON CONFLICT ({}) DO UPDATE "
                        "SET {} = excluded.{}").format(
        qualified(TABLE), sql.Identifier(ID), sql.Identifier(FIRST), sql.Identifier(ID),
        sql.Identifier(FIRST), sql.Identifier(FIRST)), (number, first))


def delete(cur: Any, number: int) -> None:
    cur.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(
        qualified(TABLE), sql.Identifier(ID)), (number,))


def writer(pg: LocalPostgres, seed: int, count: int, hold_seconds: float) -> None:
    """Transactions of 1-3 upserts or deletes on random keys (in key order, so writers do
    not deadlock); with `hold_seconds`, each stays open up to that long before it commits,
    so it commits after others that started later (its timestamp is its start)."""
    rng = random.Random(seed)
    conn = connect(pg)
    conn.autocommit = False
    for _ in range(count):
        with conn.cursor() as cur:
            for number in sorted(rng.sample(range(300), rng.randint(1, 3))):
                if rng.random() < 0.15:
                    delete(cur, number)
                else:
                    upsert(cur, number, f"f{rng.randrange(1000)}")
            if hold_seconds:
                time.sleep(rng.uniform(0, hold_seconds))  # the workload: a long transaction
        conn.commit()
    conn.close()


def definition(pg: LocalPostgres, tmp_path: Path, **table: Any) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": "watch", "source": {
            "kind": "watcher", "target": {"kind": "postgres", "dsn": pg.dsn(),
                                          "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
            "tables": [{"name": TABLE, "commit_timestamp_column": STAMP,
                        "shard_column": SHARD, "shard_values": SHARDS,
                        "deletes_table": DELETES} | table],
            "poll_interval_seconds": 0.3, "page_rows": 40},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]})


def table_now(pg: LocalPostgres) -> dict[int, str]:
    conn = connect(pg)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT {}, {} FROM {}").format(
            sql.Identifier(ID), sql.Identifier(FIRST), qualified(TABLE)))
        rows = dict(cur.fetchall())
    conn.close()
    return rows


def logged(source: Any, snapshot: Any) -> list[tuple[str, int, dict[str, Any]]]:
    """(mod type, key, keys and new values) of every change appended after the snapshot."""
    log = open_log(source.log_location()[0])
    if log.current_timestamp() < snapshot.cdc_start:
        return []
    records = follow_change_stream(log, "changes", snapshot.cdc_start,
                                   log.current_timestamp()).records
    records.sort(key=lambda r: (r.commit_timestamp, int(r.record_sequence)))
    return [(r.mod_type, int(keys[ID]), keys | new) for r in records
            for keys, new, _ in r.decoded_mods()]


def test_the_watcher_misses_nothing_under_late_commits_deletes_and_a_kill(
        pg: LocalPostgres, watched: str, tmp_path: Path):
    """Writers hold transactions open for up to 1.5 s and commit out of timestamp order,
    others commit at once, some delete; the worker is SIGKILLed mid-way. The snapshot plus
    the log rebuild the table exactly, and no row version is appended twice."""
    writer(pg, 1, 100, 0)
    stream = definition(pg, tmp_path)
    home = tmp_path / "home"
    source = open_source(stream, home)
    objects = source.discover()
    snapshot = source.snapshot(objects, None)
    rows: dict[int, str] = {}
    source.backfill(snapshot, objects, lambda item, chunk, after: rows.update(
        {r[ID]: r[FIRST] for r in chunk}))
    source.release(snapshot)
    worker = start_worker(stream, home)
    writers = [threading.Thread(target=writer, args=(pg, seed, count, hold)) for
               seed, count, hold in ((2, 150, 0), (3, 150, 0), (4, 12, 1.5), (5, 12, 1.5))]
    for thread in writers:
        thread.start()
    deadline = time.monotonic() + 60
    while len(logged(source, snapshot)) < 40:
        assert time.monotonic() < deadline, "the watcher appended nothing"
        time.sleep(0.05)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    worker = start_worker(stream, home)
    for thread in writers:
        thread.join(timeout=300)
    mark = source.mark()
    log = open_log(source.log_location()[0])
    deadline = time.monotonic() + 60
    while not source.reached(log, mark):
        assert time.monotonic() < deadline, "the watcher did not reach the mark"
        time.sleep(0.05)
    worker.terminate()
    worker.join()
    changes = logged(source, snapshot)
    for mod_type, key, values in changes:
        if mod_type == "DELETE":
            rows.pop(key, None)
        else:
            rows[key] = values[FIRST]
    assert rows == table_now(pg)
    assert {m for m, _, _ in changes} == {"UPDATE", "DELETE"}
    versions = Counter((k, v.get(STAMP)) for m, k, v in changes if m == "UPDATE")
    assert max(versions.values()) == 1, "a row version was appended twice"
    source.close()


def test_a_row_written_back_after_a_later_stamped_delete_is_not_deleted_again(
        pg: LocalPostgres, watched: str):
    """CW-1 with a deletes table: a transaction that started first (so its rows carry the
    earlier time) writes a key back after a later-started one deleted it, once by INSERT and
    once by UPDATE of a re-inserted row. The row's time is below the delete's, yet it is the
    last word: replaying a poll in its order leaves the rows as the table has them. A row
    written back and processed at once is not polled, so its delete still counts."""
    target = PostgresTarget(PostgresTargetConfig(pg.dsn(), "CDCFLOW_TEST_PG_PASSWORD"))
    table = WatchedTable(TABLE, STAMP, SHARD, tuple(SHARDS["in"]), deletes_table=DELETES)
    target.objects((table,))
    conn = connect(pg)
    with conn.cursor() as cur:
        for key in (7001, 7002, 7003):
            upsert(cur, key, "before")
    cursor = target.start_cursor(wait_past_now(target, conn))
    early = connect(pg)
    early.autocommit = False
    with early.cursor() as held, conn.cursor() as cur:
        held.execute("SELECT now()")  # the early transaction takes its time here
        for key in (7001, 7002, 7003):
            delete(cur, key)
        upsert(cur, 7002, "re-inserted")
        upsert(held, 7001, "written back")
        upsert(held, 7002, "updated back")
        upsert(held, 7003, "processed back")
        held.execute(sql.SQL("UPDATE {} SET {} = true WHERE {} = 7003").format(
            qualified(TABLE), sql.Identifier(PROCESSED), sql.Identifier(ID)))
    early.commit()
    rows = {7001: "before", 7002: "before", 7003: "before"}
    for polled in target.poll(table, cursor, wait_past_now(target, conn), 100).rows:
        key = int(json.loads(polled.key)[0])
        if polled.deleted:
            rows.pop(key, None)
        else:
            rows[key] = polled.row[FIRST]
    assert rows == {7001: "written back", 7002: "updated back"}
    with conn.cursor() as cur:
        for key in (7001, 7002, 7003):
            delete(cur, key)
    early.close()
    conn.close()
    target.close()


def test_a_delete_stays_when_the_key_written_back_is_equal_but_reads_otherwise(
        pg: LocalPostgres, watched: str):
    """Events name keys by their text: numeric 1.0 deleted and 1.00 written back by an
    earlier transaction are two keys downstream, though the column's = calls them one."""
    conn = connect(pg)
    name = "public.priced"
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (k numeric PRIMARY KEY, v text)").format(
            qualified(name)))
        prepare_table(conn, name, "ts", deletes_table="priced_deletes")
        cur.execute(sql.SQL("INSERT INTO {} VALUES (1.0, 'before')").format(qualified(name)))
    target = PostgresTarget(PostgresTargetConfig(pg.dsn(), "CDCFLOW_TEST_PG_PASSWORD"))
    table = WatchedTable(name, "ts", deletes_table="public.priced_deletes")
    target.objects((table,))
    cursor = target.start_cursor(wait_past_now(target, conn))
    early = connect(pg)
    early.autocommit = False
    with early.cursor() as held, conn.cursor() as cur:
        held.execute("SELECT now()")
        cur.execute(sql.SQL("DELETE FROM {} WHERE k = 1.0").format(qualified(name)))
        held.execute(sql.SQL("INSERT INTO {} VALUES (1.00, 'written back')").format(
            qualified(name)))
    early.commit()
    rows = {'["1.0"]': "before"}
    for polled in target.poll(table, cursor, wait_past_now(target, conn), 100).rows:
        if polled.deleted:
            rows.pop(polled.key, None)
        else:
            rows[polled.key] = polled.row["v"]
    assert rows == {'["1.00"]': "written back"}
    early.close()
    conn.close()
    target.close()


def wait_past_now(target: PostgresTarget, conn: Any) -> int:
    """A horizon past the server's clock as of this call (polling: the margin must pass)."""
    return horizon_past(target, conn, sql.SQL(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"))


def horizon_past(target: PostgresTarget, conn: Any, micros: sql.Composable) -> int:
    """The first horizon at or past the micros `micros` selects, polled for."""
    with conn.cursor() as cur:
        cur.execute(micros)
        wanted = cur.fetchone()[0]
    deadline = time.monotonic() + 30
    while (horizon := target.horizon()) < wanted:
        assert time.monotonic() < deadline, f"the horizon did not pass {wanted}"
        time.sleep(0.05)
    return horizon


def test_the_horizon_stays_below_an_open_transaction(pg: LocalPostgres, watched: str):
    """The rule: no row can still commit below the oldest running xact_start."""
    target = PostgresTarget(PostgresTargetConfig(pg.dsn(), "CDCFLOW_TEST_PG_PASSWORD"))
    holder = connect(pg)
    holder.autocommit = False
    with holder.cursor() as cur:
        cur.execute("SELECT (extract(epoch FROM now()) * 1000000)::bigint")
        started = cur.fetchone()[0]
        upsert(cur, 5000, "held")
    assert target.horizon() < started
    holder.commit()
    deadline = time.monotonic() + 30
    while target.horizon() < started:
        assert time.monotonic() < deadline, "the horizon did not pass the committed row"
        time.sleep(0.05)
    holder.close()
    target.close()


def test_polls_name_the_shards_and_use_the_partial_index(pg: LocalPostgres, tmp_path: Path):
    """CW-4/CW-5: the executed poll holds `IS NOT NULL AND ... IN (...)`, and EXPLAIN of it
    shows the partial index, whose first column is the shard (CW-2: not the timestamp, a
    write hot spot); Processed takes a row out of the polls and an update brings it back
    (CW-7)."""
    conn = connect(pg)
    name = "public.big singers"
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text)").format(
            qualified(name)))
    prepare_table(conn, name, "ts", shard_column="shard", shards=19,
                  processed_column="processed")
    conn.autocommit = False
    with conn.cursor() as cur:
        for batch in range(20):
            cur.execute(sql.SQL("INSERT INTO {} (id, name) SELECT g, 'n' || g FROM "
                                "generate_series(%s, %s) g").format(qualified(name)),
                        (batch * 1000, batch * 1000 + 999))
            conn.commit()
        cur.execute(sql.SQL("ANALYZE {}").format(qualified(name)))
    conn.commit()
    conn.autocommit = True
    target = PostgresTarget(PostgresTargetConfig(pg.dsn(), "CDCFLOW_TEST_PG_PASSWORD"))
    table = WatchedTable(name, "ts", "shard", (0, 1, 2))
    target.objects((table,))
    horizon = wait_for_horizon(target, conn, name)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT (extract(epoch FROM max(ts)) * 1000000)::bigint - 1 "
                            "FROM {}").format(qualified(name)))
        latest = cur.fetchone()[0]
    page = target.poll(table, {"rows": [latest, "past every key"]}, horizon, 100)
    query = target.last_query
    assert '"shard" IS NOT NULL AND "shard" IN (0, 1, 2)' in query
    assert page.rows and all(int(r.row["id"]) >= 19000 for r in page.rows)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT oid FROM pg_class WHERE oid = {}::regclass").format(
            sql.Literal(qualified(name).as_string(conn))))
        index = f"cdcflow_watch_{cur.fetchone()[0]}"
        cur.execute("EXPLAIN " + query)
        plan = "\n".join(line for (line,) in cur.fetchall())
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index,))
        (definition,) = cur.fetchone()
    assert index in plan, plan
    assert "(shard, ts) WHERE ((shard IS NOT NULL) AND (ts IS NOT NULL))" in definition, \
        definition
    first = page.rows[0].row["id"]
    set_processed(conn, name, first, True)
    later = wait_for_horizon(target, conn, name)
    ids = [r.row["id"] for r in target.poll(table, page.cursor, later, 1000).rows]
    assert first not in ids
    with conn.cursor() as cur:
        cur.execute(sql.SQL("UPDATE {} SET name = 'again' WHERE id = %s").format(
            qualified(name)), (first,))
    latest = wait_for_horizon(target, conn, name)
    again = target.poll(table, page.cursor, latest, 1000).rows
    assert [r.row["processed"] for r in again if r.row["id"] == first] == [False]
    target.close()
    conn.close()


def set_processed(conn: Any, name: str, key: int, value: bool) -> None:
    with conn.cursor() as cur:
        cur.execute(sql.SQL("UPDATE {} SET processed = %s WHERE id = %s").format(
            qualified(name)), (value, key))


def wait_for_horizon(target: PostgresTarget, conn: Any, name: str) -> int:
    """A horizon past every row of the table (polling for it: the margin must pass)."""
    return horizon_past(target, conn, sql.SQL(
        "SELECT (extract(epoch FROM max(ts)) * 1000000)::bigint FROM {}").format(
        qualified(name)))


def test_cleanup_nulls_old_timestamps_but_not_a_row_a_writer_is_updating(
        pg: LocalPostgres, tmp_path: Path):
    """CW-6 on PostgreSQL: rows older than the cutoff lose their timestamp in batches; a
    row a writer holds and updates meanwhile keeps the writer's new timestamp."""
    conn = connect(pg)
    name = "public.cleaned"
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(
            qualified(name)))
    prepare_table(conn, name, "ts")
    with conn.cursor() as cur:
        cur.execute(sql.SQL("INSERT INTO {} SELECT g, 0 FROM generate_series(1, 50) g"
                            ).format(qualified(name)))
    with conn.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        cutoff = cur.fetchone()[0]
    holder = connect(pg)
    holder.autocommit = False
    with holder.cursor() as cur:
        cur.execute(sql.SQL("UPDATE {} SET v = 1 WHERE id = 7").format(qualified(name)))
    target = PostgresTarget(PostgresTargetConfig(pg.dsn(), "CDCFLOW_TEST_PG_PASSWORD"))
    from cdcflow.model.timestamps import to_micros
    cleaning = threading.Thread(target=lambda: done.append(
        target.clean(WatchedTable(name, "ts"), to_micros(cutoff), 8)))
    done: list[int] = []
    cleaning.start()
    deadline = time.monotonic() + 30
    while not waiting_on_lock(conn):
        assert time.monotonic() < deadline, "the cleanup never reached the held row"
        time.sleep(0.05)
    holder.commit()
    cleaning.join(timeout=60)
    assert done == [49]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT id FROM {} WHERE ts IS NOT NULL").format(qualified(name)))
        assert cur.fetchall() == [(7,)]
    holder.close()
    target.close()
    conn.close()


def waiting_on_lock(conn: Any) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        return bool(cur.fetchone()[0])


def test_hostile_options_are_quoted_and_bad_ones_named(pg: LocalPostgres, watched: str,
                                                       tmp_path: Path):
    """Every identifier option with quotes, spaces and semicolons is quoted (the sentinel
    table survives); a wrong type, a missing table or a bare name is a typed error."""
    stream = definition(pg, tmp_path, soft_delete_column=PROCESSED)
    source = open_source(stream, tmp_path / "home")
    assert [o.name for o in source.discover()] == [TABLE]
    source.close()
    conn = connect(pg)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM sentinel")
        assert cur.fetchone() == (0,)
    bad = [({"commit_timestamp_column": FIRST}, InvalidArgument, "not timestamptz"),
           ({"shard_column": ID + "x"}, InvalidArgument, "not a column"),
           ({"name": "public.missing"}, NotFound, "public.missing")]
    for change, error, words in bad:
        broken = open_source(definition(pg, tmp_path, **change), tmp_path / "home")
        with pytest.raises(error, match=words):
            broken.discover()
        broken.close()
    with pytest.raises(InvalidArgument, match="'bare': name PostgreSQL tables as schema"):
        definition(pg, tmp_path, name="bare")
    with pytest.raises(InvalidArgument, match="shards"):
        prepare_table(conn, TABLE, STAMP, shard_column=SHARD)
    conn.close()


def test_a_role_without_pg_read_all_stats_is_told_what_it_needs(pg: LocalPostgres):
    pg.sql("shop", f"CREATE ROLE lowly LOGIN PASSWORD '{pg.password}'")
    with pytest.raises(FailedPrecondition, match="pg_read_all_stats") as refused:
        PostgresTarget(PostgresTargetConfig(pg.dsn(user="lowly"), "CDCFLOW_TEST_PG_PASSWORD"))
    assert pg.password not in str(refused.value)


def watcher_cli(*args: str) -> tuple[int, Any]:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "watcher", *args,
                             "--json"], capture_output=True, text=True, timeout=120,
                            check=False)
    return result.returncode, json.loads(result.stdout)


def test_prepare_postgres_from_the_cli_leaves_the_application_unchanged(pg: LocalPostgres):
    """The app's INSERT, UPDATE and DELETE stay as they were; the table gains a stamped
    timestamp, a Processed column, a generated shard in range, a deletes table, and the
    partial index with its predicate. A half-given shard option is refused, naming it."""
    conn = connect(pg)
    name = 'public.app "orders"; x'
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (region text, id int, PRIMARY KEY (region, id))"
                            ).format(qualified(name)))
    common = ["--dsn", pg.dsn(), "--password-env", "CDCFLOW_TEST_PG_PASSWORD"]
    code, out = watcher_cli("prepare-postgres", name, *common, "--timestamp-column", "ts",
                            "--shard-column", "shard", "--shards", "5",
                            "--processed-column", "done", "--deletes-table", "gone; orders")
    assert code == 0, out
    assert any("WHERE \"shard\" IS NOT NULL AND \"ts\" IS NOT NULL" in s
               for s in out["statements"])
    with conn.cursor() as cur:
        cur.execute(sql.SQL("INSERT INTO {} VALUES ('eu', 1), ('us', 2)").format(
            qualified(name)))
        cur.execute(sql.SQL("DELETE FROM {} WHERE id = 2").format(qualified(name)))
        cur.execute(sql.SQL("SELECT ts IS NOT NULL, shard, done FROM {}").format(
            qualified(name)))
        stamped, shard, done = cur.fetchone()
        assert stamped and -4 <= shard <= 4 and done is False
        cur.execute('SELECT region, id FROM public."gone; orders"')
        assert cur.fetchall() == [("us", 2)]
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname LIKE 'cdcflow_watch_%%' "
                    "AND indexdef LIKE %s", ("%app%",))
        assert "WHERE ((shard IS NOT NULL) AND (ts IS NOT NULL))" in cur.fetchone()[0]
    code, out = watcher_cli("prepare-postgres", name, *common, "--timestamp-column", "ts",
                            "--shards", "5")
    assert code == 2 and "shard_column None and shards 5" in out["message"]
    conn.close()
