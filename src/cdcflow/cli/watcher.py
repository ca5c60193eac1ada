"""`cdcflow watcher cleanup NAME TABLE --older-than 24h`: the watcher's cleanup (CW-6);
`cdcflow watcher prepare-postgres TABLE ...`: make a PostgreSQL table watchable."""

from __future__ import annotations

import os
from dataclasses import asdict
from datetime import timedelta

import click

from cdcflow.capture.postgres.connection import connect
from cdcflow.capture.watcher.pg_schema import prepare_table
from cdcflow.cli.streams import DEFAULT_CATALOG, _emit, _errors, json_option
from cdcflow.store.ddl import parse_duration_micros
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.cleanup import cleanup as run_cleanup


@click.group()
@click.option("--catalog", default=lambda: os.environ.get("CDCFLOW_CATALOG", DEFAULT_CATALOG),
              show_default=DEFAULT_CATALOG, help="The catalog file.")
@click.pass_context
def watcher(ctx: click.Context, catalog: str) -> None:
    """Jobs of polling change watchers."""
    ctx.ensure_object(dict)
    ctx.obj["catalog"] = catalog


@watcher.command()
@click.argument("name")
@click.argument("table")
@click.option("--older-than", required=True, help="Age of the rows to clean: 24h, 90m, 7d.")
@click.option("--batch-rows", default=1_000, show_default=True, type=int,
              help="Rows per transaction of the partitioned update.")
@json_option
@click.pass_context
@_errors
def cleanup(ctx: click.Context, name: str, table: str, older_than: str, batch_rows: int,
            as_json: bool) -> None:
    """Set the commit timestamp of TABLE's rows older than --older-than to NULL, so they
    leave the watcher's null-filtered index. Only for rows no writer updates meanwhile."""
    age = timedelta(microseconds=parse_duration_micros(older_than))
    done = run_cleanup(Catalog(ctx.obj["catalog"]), name, table, age, batch_rows)
    _emit(as_json, asdict(done), f"{done.rows} rows of {table} older than {done.cutoff} "
                                 "cleaned")


@watcher.command("prepare-postgres")
@click.argument("table")
@click.option("--dsn", required=True, help="libpq keywords or a postgresql:// URL, no password.")
@click.option("--password-env", default=None, help="Environment variable with the password.")
@click.option("--timestamp-column", required=True, help="Column the stamp trigger keeps.")
@click.option("--shard-column", default=None, help="Generated shard column to add (CW-3).")
@click.option("--shards", default=None, type=int, help="Shards: values -(N-1)..N-1.")
@click.option("--processed-column", default=None, help="Processed column to add (CW-7).")
@click.option("--deletes-table", default=None, help="Table a delete trigger fills.")
@json_option
@_errors
def prepare_postgres(table: str, dsn: str, password_env: str | None, timestamp_column: str,
                     shard_column: str | None, shards: int | None,
                     processed_column: str | None, deletes_table: str | None,
                     as_json: bool) -> None:
    """Add to TABLE (schema.table) what the watcher polls: the timestamp column and its
    trigger, optionally a Processed column, a generated shard column and a deletes table,
    and the partial index. Applications that write TABLE need no change."""
    conn = connect(dsn, password_env)
    try:
        done = prepare_table(conn, table, timestamp_column, shard_column=shard_column,
                             shards=shards, processed_column=processed_column,
                             deletes_table=deletes_table)
    finally:
        conn.close()
    _emit(as_json, {"table": table, "statements": done},
          "\n".join([*done, f"{table} is ready for the watcher"]))
