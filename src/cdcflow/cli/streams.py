"""`cdcflow streams ...` and `cdcflow discover`: manage streams in the catalog. Every command
takes `--json`; errors exit with status 2 and name the value and the rule."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cdcflow.capture.postgres.connection import describe_dsn
from cdcflow.errors import CdcflowError, InvalidArgument
from cdcflow.streams.catalog import Catalog, UnreadableStream
from cdcflow.streams.definition import (
    EmbeddedSource,
    MySqlSource,
    PostgresSource,
    StreamDefinition,
    WatcherSource,
)
from cdcflow.streams.discovery import discover_definition, discover_embedded
from cdcflow.streams.rebackfill import request_backfill
from cdcflow.streams.sources import remove_source
from cdcflow.streams.states import check_deletable

DEFAULT_CATALOG = "cdcflow-catalog.db"


def _emit(as_json: bool, data: Any, text: str | Table) -> None:
    if as_json:
        click.echo(json.dumps(data, default=str, indent=None))
    elif isinstance(text, Table):
        Console().print(text)
    else:
        click.echo(text)


def _errors(command: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except CdcflowError as error:
            if kwargs.get("as_json"):
                click.echo(json.dumps({"error": type(error).__name__, "message": str(error)}))
            else:
                click.echo(f"error: {error}", err=True)
            raise SystemExit(2) from None

    return wrapped


def source_label(definition: StreamDefinition) -> str:
    match definition.source:
        case EmbeddedSource(database=database, change_stream=change_stream):
            return f"embedded: {database} / {change_stream}"
        case PostgresSource(dsn=dsn):
            return f"postgres: {describe_dsn(dsn)}"
        case MySqlSource(host=host, port=port, user=user, databases=databases):
            return f"mysql: {user}@{host}:{port} / {', '.join(databases)}"
        case WatcherSource(target=target, tables=tables):
            where = target.database if target.kind == "embedded" else describe_dsn(target.dsn)
            return f"watcher: {target.kind} {where} / {', '.join(t.name for t in tables)}"
    raise AssertionError(definition.source)


def _catalog(ctx: click.Context) -> Catalog:
    return Catalog(ctx.obj["catalog"])


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group()
@click.option("--catalog", default=lambda: os.environ.get("CDCFLOW_CATALOG", DEFAULT_CATALOG),
              show_default=DEFAULT_CATALOG, help="The catalog file.")
@click.pass_context
def streams(ctx: click.Context, catalog: str) -> None:
    """Create, control and inspect streams."""
    ctx.ensure_object(dict)
    ctx.obj["catalog"] = catalog


@streams.command()
@click.argument("definition", type=click.Path(exists=True, dir_okay=False))
@json_option
@click.pass_context
@_errors
def create(ctx: click.Context, definition: str, as_json: bool) -> None:
    """Create a stream from a YAML definition file."""
    parsed = StreamDefinition.from_file(definition)
    _catalog(ctx).create(parsed)
    _emit(as_json, {"name": parsed.name, "state": "NOT_STARTED"}, f"created {parsed.name}")


@streams.command(name="list")
@json_option
@click.pass_context
@_errors
def list_streams(ctx: click.Context, as_json: bool) -> None:
    """List streams and their states."""
    table = Table("name", "state", "source", "destinations")
    rows: list[dict[str, str]] = []
    for r in _catalog(ctx).records():
        rows.append({"name": r.name, "state": str(r.state)})
        if isinstance(r, UnreadableStream):
            rows[-1]["unreadable"] = r.error
            table.add_row(r.name, r.state, f"unreadable: {r.error}", "")
        else:
            table.add_row(r.name, r.state.value, source_label(r.definition),
                          ", ".join(d.kind for d in r.definition.destinations))
    _emit(as_json, rows, table)


@streams.command()
@click.argument("name")
@json_option
@click.pass_context
@_errors
def describe(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show a stream's definition and state."""
    record = _catalog(ctx).get(name)
    data = {"state": record.state.value, "retries": record.retries,
            "definition": record.definition.model_dump(mode="json")}
    _emit(as_json, data, f"state: {record.state.value}\n{record.definition.to_yaml()}")


def _action(name: str, action: str, help_text: str) -> None:
    @streams.command(name=name, help=help_text)
    @click.argument("stream")
    @json_option
    @click.pass_context
    @_errors
    def command(ctx: click.Context, stream: str, as_json: bool) -> None:
        state = _catalog(ctx).act(stream, action)
        _emit(as_json, {"name": stream, "state": state.value}, f"{stream}: {state.value}")


_action("start", "start", "Start a stream (NOT_STARTED -> STARTING; the runner takes over).")
_action("pause", "pause", "Pause a running stream.")
_action("resume", "resume", "Resume a paused stream.")
_action("drain", "drain", "Finish what was read, then stop (RUNNING -> DRAINING).")
_action("reset", "reset", "Return a FAILED_PERMANENTLY stream to NOT_STARTED.")


@streams.command()
@click.argument("name")
@click.option("--keep-slot", is_flag=True,
              help="Keep the source's replication slot and publication.")
@json_option
@click.pass_context
@_errors
def delete(ctx: click.Context, name: str, keep_slot: bool, as_json: bool) -> None:
    """Delete a stream that is not running (and its slot and publication, for PostgreSQL)."""
    catalog = _catalog(ctx)
    if not keep_slot:
        try:
            record = catalog.get(name)
        except InvalidArgument as error:  # a definition this cdcflow cannot read
            raise InvalidArgument(
                f"{error}: without it the stream's slot and publication cannot be dropped; "
                f"delete it with --keep-slot, then drop them on the server if it has them"
            ) from None
        check_deletable(record.state)
        remove_source(record.definition, Path(catalog.path).resolve().parent)
    catalog.delete(name)
    _emit(as_json, {"name": name, "deleted": True, "kept_slot": keep_slot}, f"deleted {name}")


@streams.command()
@click.argument("name")
@click.argument("object_name", metavar="OBJECT")
@json_option
@click.pass_context
@_errors
def backfill(ctx: click.Context, name: str, object_name: str, as_json: bool) -> None:
    """Backfill one object (schema.table) again while the stream goes on; `status` shows
    its progress under backfill_again."""
    request = request_backfill(_catalog(ctx), name, object_name)
    _emit(as_json, {"name": name} | request,
          f"{name}: backfill of {object_name} requested ({request['id']})")


@streams.command()
@click.argument("name")
@json_option
@click.pass_context
@_errors
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """State, backfill per object, rows processed, lag, throughput and partitions."""
    data = _catalog(ctx).status(name)
    table = Table("field", "value")
    for key, value in data.items():
        table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
    _emit(as_json, data, table)


@streams.command()
@click.argument("name")
@click.option("--limit", default=20, show_default=True)
@json_option
@click.pass_context
@_errors
def errors(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """Recent errors with time, object and message (FetchStreamErrors)."""
    found = _catalog(ctx).errors(name, limit)
    table = Table("time", "object", "message")
    for error in found:
        when = datetime.fromtimestamp(error["time"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        table.add_row(when, error["object"], error["message"])
    _emit(as_json, found, table)


@click.command()
@click.argument("profile")
@json_option
@_errors
def discover(profile: str, as_json: bool) -> None:
    """Objects and fields of a source: an embedded database file, or a stream YAML file."""
    if profile.endswith((".yaml", ".yml")):
        definition = StreamDefinition.from_file(profile)
        found = discover_definition(definition, Path(profile).resolve().parent)
    else:
        found = discover_embedded(profile)
    table = Table("object", "field", "type", "key", "nullable")
    for obj in found:
        for field in obj["fields"]:
            table.add_row(obj["object"], field["name"], field["type"],
                          str(field["primary_key_position"] or ""), str(field["nullable"]))
    _emit(as_json, found, table)
