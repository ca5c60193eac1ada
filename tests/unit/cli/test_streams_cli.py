"""The `cdcflow streams` and `cdcflow discover` commands through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdcflow import Database
from cdcflow.cli.main import cli

pytestmark = pytest.mark.unit

DEFINITION = """
name: s1
source: {kind: embedded, database: DB, change_stream: Everything}
destinations:
  - {kind: event_files, root: events}
"""


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["streams", "--catalog", str(tmp_path / "c.db"), *args])
    return result.exit_code, result.output


def test_stream_lifecycle_through_the_cli(tmp_path: Path):
    path = tmp_path / "s1.yaml"
    path.write_text(DEFINITION.replace("DB", str(tmp_path / "shop.db")))
    assert run(tmp_path, "create", str(path), "--json") == (
        0, json.dumps({"name": "s1", "state": "NOT_STARTED"}) + "\n")
    code, out = run(tmp_path, "create", str(path), "--json")
    assert code == 2 and json.loads(out)["error"] == "AlreadyExists"
    code, out = run(tmp_path, "list", "--json")
    assert json.loads(out) == [{"name": "s1", "state": "NOT_STARTED"}]
    for action, state in [("start", "STARTING"), ("pause", "PAUSED"), ("resume", "STARTING")]:
        code, out = run(tmp_path, action, "s1", "--json")
        assert code == 0 and json.loads(out)["state"] == state
    code, out = run(tmp_path, "drain", "s1")
    assert code == 2 and "cannot drain a stream in state STARTING" in out
    code, out = run(tmp_path, "describe", "s1", "--json")
    described = json.loads(out)
    assert described["state"] == "STARTING"
    assert described["definition"]["destinations"][0]["kind"] == "event_files"
    code, out = run(tmp_path, "status", "s1", "--json")
    assert json.loads(out)["state"] == "STARTING"
    code, out = run(tmp_path, "errors", "s1", "--json")
    assert json.loads(out) == []
    code, out = run(tmp_path, "status", "s1")
    assert code == 0 and "STARTING" in out
    code, out = run(tmp_path, "delete", "s1")
    assert code == 2 and "STARTING" in out
    run(tmp_path, "pause", "s1")
    assert run(tmp_path, "delete", "s1")[0] == 0
    code, out = run(tmp_path, "describe", "s1")
    assert code == 2 and "'s1' does not exist" in out


def test_bad_definition_file_is_an_error(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: s1\nsource: {kind: oracle}\n")
    code, out = run(tmp_path, "create", str(path))
    assert code == 2 and "invalid stream definition" in out


def test_discover(tmp_path: Path):
    db = Database.open(tmp_path / "shop.db")
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)")
    result = CliRunner().invoke(cli, ["discover", str(tmp_path / "shop.db"), "--json"])
    assert result.exit_code == 0
    (found,) = json.loads(result.output)
    assert found["object"] == "Orders" and found["fields"][1]["nullable"] is True
    text = CliRunner().invoke(cli, ["discover", str(tmp_path / "shop.db")])
    assert "Orders" in text.output and "INT64" in text.output
    missing = CliRunner().invoke(cli, ["discover", str(tmp_path / "nope.db")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_list_names_every_kind_of_source(tmp_path: Path):
    """`streams list` in text labels each kind of source (no password in it)."""
    mysql = ("name: my\nsource: {kind: mysql, host: 127.0.0.1, port: 3307, user: cdc, "
             "password_env: X, databases: [shop]}\ndestinations: [{kind: event_files, "
             "root: e}]\n")
    watcher = ("name: w\nsource: {kind: watcher, target: {kind: embedded, database: a.db}, "
               "tables: [{name: Singers, commit_timestamp_column: LastModified}]}\n"
               "destinations: [{kind: event_files, root: e}]\n")
    for name, text in (("my", mysql), ("w", watcher)):
        (tmp_path / f"{name}.yaml").write_text(text)
        assert run(tmp_path, "create", str(tmp_path / f"{name}.yaml"))[0] == 0
    listed = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["streams", "--catalog", str(tmp_path / "c.db"), "list"])
    code, out = listed.exit_code, listed.output
    assert code == 0, out
    assert "mysql: cdc@127.0.0.1:3307 / shop" in out and "watcher: embedded a.db / Singers" \
        in out
