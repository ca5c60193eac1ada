"""A stored definition this cdcflow cannot read (one a newer version wrote, or a rule it no
longer meets) stops only its own stream. The runner fails that stream permanently, with
the parse error and the way out recorded, and goes on with the others; `streams list`,
`status` and `errors` show it; `delete --keep-slot` removes it, and a plain `delete`, which
needs the definition to drop the source's slot, refuses naming why. Before, the one
definition stopped the runner, `cdcflow run` and `streams list` for every stream."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdcflow import FakeClock
from cdcflow.cli.main import cli
from cdcflow.errors import InvalidArgument
from cdcflow.streams.catalog import Catalog, StreamRecord, UnreadableStream
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner, Worker
from cdcflow.streams.states import StreamState
from tests.unit.streams.test_runner_failures import drive

pytestmark = pytest.mark.unit


def create(catalog: Catalog, name: str, folder: Path) -> None:
    catalog.create(StreamDefinition.parse({
        "name": name, "source": {"database": str(folder / "missing.db"), "change_stream": "S"},
        "destinations": [{"kind": "event_files", "root": str(folder / "events")}]}))


def make_unreadable(catalog: Catalog, name: str, state: StreamState) -> None:
    """As a newer cdcflow would leave it: a source kind this version does not know."""
    with sqlite3.connect(catalog.path) as conn:
        (text,) = conn.execute("SELECT definition FROM streams WHERE name = ?",
                               (name,)).fetchone()
        stored = json.loads(text)
        stored["source"] = {"kind": "oracle", "dsn": "db"}
        conn.execute("UPDATE streams SET definition = ?, state = ? WHERE name = ?",
                     (json.dumps(stored), state.value, name))


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    catalog = Catalog(tmp_path / "catalog.db", FakeClock())
    for name in ("a", "b", "c"):
        create(catalog, name, tmp_path)
    catalog.act("a", "start")
    make_unreadable(catalog, "b", StreamState.RUNNING)
    make_unreadable(catalog, "c", StreamState.PAUSED)
    return catalog


def test_records_give_the_unreadable_apart_and_streams_still_refuse(catalog: Catalog):
    first, second, third = catalog.records()
    assert isinstance(first, StreamRecord) and first.definition.name == "a"
    assert isinstance(second, UnreadableStream) and isinstance(third, UnreadableStream)
    assert (second.name, second.state, third.state) == ("b", StreamState.RUNNING,
                                                         StreamState.PAUSED)
    assert second.error.startswith("invalid stream definition: source")
    with pytest.raises(InvalidArgument, match="invalid stream definition"):
        catalog.streams()


def test_the_runner_fails_the_unreadable_stream_and_drives_the_others(catalog: Catalog):
    seen = drive(Runner(catalog.path, spark=None, clock=catalog.clock), catalog,
                 catalog.clock, "a", steps=3)
    assert [state for _, state in seen] == [StreamState.FAILED]  # driven: no database
    [error] = catalog.errors("b")
    assert error["message"].startswith(
        "stream 'b': this cdcflow cannot read its stored definition (invalid stream "
        "definition: source")
    assert error["message"].endswith(
        "run the cdcflow that created it, or delete the stream (`cdcflow streams delete b "
        "--keep-slot`, then drop its slot and publication on the server, if it has them) "
        "and create it again")
    states = {r.name: r.state for r in catalog.records() if isinstance(r, UnreadableStream)}
    assert states == {"b": StreamState.FAILED_PERMANENTLY, "c": StreamState.PAUSED}
    assert catalog.errors("c") == []  # not driven: left as the user left it


def cli_run(catalog: Catalog, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["streams", "--catalog", str(catalog.path), *args])
    return result.exit_code, result.output


def test_the_cli_lists_shows_and_deletes_an_unreadable_stream(catalog: Catalog):
    code, out = cli_run(catalog, "list", "--json")
    listed = json.loads(out)
    assert code == 0 and [row["name"] for row in listed] == ["a", "b", "c"]
    assert listed[1]["state"] == "RUNNING"
    assert listed[1]["unreadable"].startswith("invalid stream definition: source")
    code, out = cli_run(catalog, "status", "c", "--json")
    assert code == 0 and json.loads(out)["unreadable"] == listed[2]["unreadable"]
    assert cli_run(catalog, "errors", "c", "--json") == (0, "[]\n")
    code, out = cli_run(catalog, "delete", "c", "--json")
    assert code == 2 and json.loads(out)["error"] == "InvalidArgument", out
    assert json.loads(out)["message"].startswith("invalid stream definition: source")
    assert json.loads(out)["message"].endswith(
        "without it the stream's slot and publication cannot be dropped; delete it with "
        "--keep-slot, then drop them on the server if it has them")
    assert [r.name for r in catalog.records() if isinstance(r, UnreadableStream)] == ["b", "c"]
    assert cli_run(catalog, "delete", "c", "--keep-slot", "--json")[0] == 0
    code, out = cli_run(catalog, "delete", "b", "--keep-slot", "--json")
    assert code == 2 and "cannot delete a stream in state RUNNING" in out
    assert [r.name if isinstance(r, UnreadableStream) else r.definition.name
            for r in catalog.records()] == ["a", "b"]
    assert cli_run(catalog, "pause", "b", "--json")[0] == 0  # no runner needed to stop it
    assert cli_run(catalog, "delete", "b", "--keep-slot", "--json")[0] == 0
    assert [r.definition.name for r in catalog.records()] == ["a"]  # type: ignore[union-attr]


@pytest.mark.parametrize("state", [StreamState.STARTING, StreamState.RUNNING,
                                   StreamState.DRAINING, StreamState.FAILED])
def test_every_state_a_runner_drives_gives_up(catalog: Catalog, state: StreamState):
    make_unreadable(catalog, "b", state)
    Runner(catalog.path, spark=None, clock=catalog.clock).step()
    [found] = [r for r in catalog.records() if isinstance(r, UnreadableStream) and r.name == "b"]
    assert found.state == StreamState.FAILED_PERMANENTLY
    assert len(catalog.errors("b")) == 1


def test_a_state_this_version_does_not_know_stops_only_its_stream(catalog: Catalog):
    """A newer cdcflow may store a state this one lacks: the stream is shown with it, left
    alone by the runner, and an action on it names the state."""
    with sqlite3.connect(catalog.path) as conn:
        conn.execute("UPDATE streams SET state = 'SNAPSHOTTING' WHERE name = 'a'")
    runner = Runner(catalog.path, spark=None, clock=catalog.clock)
    runner.step()
    assert runner.workers == {}  # `a` is not driven, `b` given up
    [found] = [r for r in catalog.records() if isinstance(r, UnreadableStream) and r.name == "a"]
    unknown = ("stream 'a' is in state 'SNAPSHOTTING', which this cdcflow does not know; run "
               "the cdcflow that set it")
    assert (found.state, found.error) == ("SNAPSHOTTING", unknown)
    for action in (["pause", "a"], ["delete", "a"], ["describe", "a"]):
        code, out = cli_run(catalog, *action, "--json")
        assert code == 2 and json.loads(out)["message"] == unknown, (action, out)
    assert json.loads(cli_run(catalog, "list", "--json")[1])[0]["state"] == "SNAPSHOTTING"
    assert catalog.errors("a") == []


def test_a_stream_that_turns_unreadable_under_a_runner_is_let_go(catalog: Catalog):
    """A newer cdcflow may rewrite a stream this runner drives: the runner lets its worker
    go (stopping what runs for it) rather than drive a definition it cannot read."""
    runner = Runner(catalog.path, spark=None, clock=catalog.clock)
    runner.workers["b"] = Worker("b")
    runner.step()
    assert "b" not in runner.workers
    assert catalog.status("b")["state"] == StreamState.FAILED_PERMANENTLY
