"""`cdcflow watcher cleanup NAME TABLE --older-than 24h`: the watcher's cleanup (CW-6)."""

from __future__ import annotations

import os
from dataclasses import asdict
from datetime import timedelta

import click

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
