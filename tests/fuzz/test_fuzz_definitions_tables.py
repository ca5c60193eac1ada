"""Issue 14, part 3 ("bad input, fuzzed"): hypothesis fuzz of stream definitions (dicts, YAML
text, files through `cdcflow streams create FILE`) and of CDC-table appends.

Each input succeeds or raises a `CdcflowError` naming the offending value and the rule. An
accepted definition is usable (round trips, finite durations, no NUL, no empty paths); a failed
append leaves the table's files byte for byte as they were, an accepted one reads back as
meant, and a later good append and apply still work.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import string
import tempfile
import threading
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import partial, reduce
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow import FakeClock
from cdcflow.cli.streams import streams
from cdcflow.errors import CdcflowError
from cdcflow.model.sequence import ChangeSequenceNumber, sort_key_of
from cdcflow.streams.definition import StreamDefinition
from cdcflow.table import CdcTable

pytestmark = pytest.mark.property
QUIET = list(HealthCheck)
Row = dict[str, Any]

# ---- stream definitions -------------------------------------------------------------------

SOURCES = {
    "embedded": {"kind": "embedded", "database": "shop.db", "change_stream": "Everything"},
    "postgres": {"kind": "postgres", "dsn": "host=db port=5432 dbname=shop user=cdc",
                 "password_env": "PGPASS", "slot": "s1", "publication": "p1",
                 "heartbeat_seconds": 5, "primary_keys": {"public.t": ["id"]},
                 "numeric_precision": {"public.t.amount": [12, 2]},
                 "retained_wal_warning_mb": 512, "chunk_rows": 1000},
    "mysql": {"kind": "mysql", "host": "db", "port": 3306, "user": "cdc",
              "password_env": "MYSQL_PWD", "databases": ["shop"], "server_id": 7,
              "heartbeat_seconds": 1, "chunk_rows": 100, "on_position_lost": "backfill"},
    "watcher": {"kind": "watcher", "target": {"kind": "embedded", "database": "shop.db"},
                "tables": [{"name": "orders", "commit_timestamp_column": "updated_at",
                            "shard_column": "shard", "shard_values": [0, 3],
                            "soft_delete_column": "deleted"}],
                "poll_interval_seconds": 2, "adaptive": False, "page_rows": 50},
    "watcher_pg": {"kind": "watcher", "target": {
        "kind": "postgres", "dsn": "postgresql://cdc@db/shop", "password_env": "PGPASS",
        "horizon_margin_seconds": 0.5}, "tables": [{
            "name": "public.orders", "commit_timestamp_column": "updated_at",
            "shard_column": "shard", "shard_values": {"in": [1, 2]},
            "deletes_table": "public.orders_deletes"}]}}
DESTINATIONS = [{"kind": "cdc_table", "warehouse": "lake", "max_staleness_seconds": 60,
                 "delete_retention_seconds": 3600},
                {"kind": "event_files", "root": "events", "format": "avro", "max_events": 10,
                 "max_bytes": 4096, "max_seconds": 5}]
VALID = {kind: {"name": f"s-{kind}", "source": source, "include": ["public.*"],
                "exclude": ["public.tmp_*", "é*"], "backfill": "none",
                "destinations": DESTINATIONS, "spark": {
                    "master": "local[2]", "trigger_seconds": 0.5, "max_records_per_trigger": 9}}
         for kind, source in SOURCES.items()}
HOSTILE = ["a\x00b", "", " ", "'", '"', "a'; DROP TABLE t; --", "x\ny: z", "\x00", "${HOME}",
           "../../etc/passwd", "*", "é€", "\u202e", "x" * 3000, "- [", "{a: 1}", "&a *a",
           "!!python/name:os.system", "\ud800", "\t", "NaN", "-1", "1e999", "kind"]
PATHS = {"database", "warehouse", "root", "host", "user", "master", "change_stream", "name"}
NUMBERS = [1e308, 1e10, math.inf, -1, 0, -0.0, math.nan, 2**63, 10**400, 1e-300, True]
texts = st.sampled_from(HOSTILE) | st.text(max_size=12)
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | texts
           | st.sampled_from([0, -1, 2**31, 2**63, 2**64, 10**400, 1e308, -0.0]))
values = (st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(texts, c, max_size=3), max_leaves=6)
          | st.integers(60, 3000).map(lambda depth: reduce(lambda v, _: [v], range(depth), "x"))
          | st.binary(max_size=4) | st.dates())


def near(value: Any) -> st.SearchStrategy[Any]:
    """Wrong values of the kind a field holds: hostile text for text, odd numbers for numbers."""
    if isinstance(value, str):
        return texts
    return st.sampled_from(NUMBERS if isinstance(value, int | float) else [[], {}, None, ""])


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) and len(prefix) < 6 else [])
    return [prefix] + [p for k, v in items for p in paths(v, (*prefix, k))]


def mutate(data: Any, path: tuple[Any, ...], op: str, value: Any, key: Any) -> Any:
    if not path:
        return value
    parent, last = reduce(lambda node, step: node[step], path[:-1], data), path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif op == "wrap":
        parent[last] = [parent[last]]
    elif isinstance(parent[last], dict):
        parent[last][key] = value
    return data


def check_usable(definition: StreamDefinition) -> None:
    """An accepted definition round trips (YAML, the catalog's JSON) and its settings work."""
    assert StreamDefinition.from_yaml(definition.to_yaml()) == definition
    assert StreamDefinition.parse(json.loads(definition.model_dump_json())) == definition
    stack: list[tuple[str, Any]] = list(definition.model_dump().items())
    while stack:
        name, value = stack.pop()
        if isinstance(value, dict | list | tuple):
            stack += value.items() if isinstance(value, dict) else [(name, v) for v in value]
        elif isinstance(value, str):
            assert "\x00" not in value and (value or name not in PATHS), (name, value)
        elif name.endswith("_seconds") and value is not None:
            assert math.isfinite(value) and value <= threading.TIMEOUT_MAX, (name, value)
            timedelta(seconds=value)


def check_outcome(load: Any, key: Any = None, value: Any = None) -> None:
    """A load succeeds with a usable result, or fails typed naming the key and, where the
    message shows that field's value, the value."""
    try:
        return check_usable(load())
    except CdcflowError as error:
        message = str(error)
    assert "definition" in message and len(message) > 30, message
    if isinstance(key, str) and key and "\x00" not in key and key != "kind":
        assert key[:30] in message or repr(key)[1:31] in message, (key, message)
        shown = repr(value) if isinstance(value, str | int | float) else ""
        if f"{key}: " in message and 0 < len(shown) < 40 and "password" not in shown \
                and "://" not in shown:
            assert shown in message, (shown, message)


@settings(derandomize=True, deadline=None, max_examples=1000, suppress_health_check=QUIET)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_mutated_definition_dicts_parse_or_fail_typed(kind: str, data: st.DataObject):
    """Issue 14, fuzzed input: a valid definition of each source kind, mutated 1 to 3 times
    (values replaced by wrong types, hostile strings, huge numbers or deep nests; keys deleted,
    added or wrapped in lists), parses or fails with InvalidArgument naming the field."""
    assert StreamDefinition.parse(copy.deepcopy(VALID[kind])) is not None
    mutated: Any = copy.deepcopy(VALID[kind])
    for step in range(data.draw(st.sampled_from([1, 1, 2, 3]))):
        found = paths(mutated)  # hypothesis favours the first: start from either end
        path = data.draw(st.sampled_from(found) | st.sampled_from(found[::-1]))
        op = data.draw(st.sampled_from(["replace", "replace", "delete", "extra", "wrap"]))
        wrong = near(reduce(lambda node, k: node[k], path, mutated))
        value, key = data.draw(wrong | wrong | values), data.draw(texts | st.integers())
        mutated = mutate(mutated, path, op, value, key)
        named = (key if op == "extra" and path else (path[-1] if path else None),
                 value if op == "replace" else None)
        check_outcome(partial(StreamDefinition.parse, mutated), *named if step == 0 else ())


SECRET_FORMS = ["host=db password={s}", "host=db password = '{s} x'", "host=db PASSWORD={s}",
                "postgresql://cdc:{s}@db/shop", "postgres://db/shop?password={s}",
                "postgres://?pass%77ord={s}", "host=db\npassword={s}",
                "postgresql://cdc:{s}@db:5432/shop?sslmode=require", "host=db password={s}'; --"]


@settings(derandomize=True, deadline=None, max_examples=60, suppress_health_check=QUIET)
@given(secret=st.text(string.ascii_letters + string.digits, min_size=6, max_size=10),
       form=st.sampled_from(SECRET_FORMS), where=st.sampled_from(["postgres", "watcher_pg"]),
       broken=st.booleans())
def test_passwords_in_dsns_are_refused_and_never_shown(secret: str, form: str, where: str,
                                                       broken: bool):
    """Issue 14, fuzzed input: a DSN with a password (keyword, URL user info, URL query, even
    percent-encoded) is refused, and no message (nor a YAML syntax error on its line) shows it."""
    definition, secret = copy.deepcopy(VALID[where]), "Zq" + secret
    source = definition["source"]
    (source if where == "postgres" else source["target"])["dsn"] = form.format(s=secret)
    text = yaml.safe_dump(definition).replace("dsn: ", 'dsn: "' if broken else "dsn: ", 1)
    loads = [lambda: StreamDefinition.from_yaml(text)] + (
        [] if broken else [lambda: StreamDefinition.parse(definition)])
    for load in loads:
        with pytest.raises(CdcflowError) as caught:
            load()
        assert secret[:6] not in str(caught.value), str(caught.value)
        assert broken or "dsn" in str(caught.value), str(caught.value)


BOMB = "\n".join(["l0: &l0 [x, x, x, x, x, x, x, x, x]"] + [
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]) + "\nname: *l8\n"
HOSTILE_DOCS = [BOMB, BOMB.replace("name:", "source: {kind: *l8}\nname2:"),
                "name: &a [*a]\n", "source: &a {x: *a}\n", "[" * 1200 + "]" * 1200,
                "a: " + "{a: " * 200 + "1" + "}" * 200, "- " * 500 + "x", "", "~", "42",
                "'just text'", "[1, 2]", "---\nname: a\n---\nname: b\n", "\t name: x",
                "!!python/object/apply:os.system [ls]", "name: !!binary aGk=",
                "? [1, 2]\n: 3\n", "name: x\nname: y\n", "<<: {name: x}\n", "\ufeffname: a",
                "a: &x 1\nb: *y\n", "name: \"unterminated", "%YAML 9.9\n---\na: 1"]


@settings(derandomize=True, deadline=None, max_examples=100, suppress_health_check=QUIET)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_mutated_yaml_text_loads_or_fails_typed(kind: str, data: st.DataObject):
    """Issue 14, fuzzed input: YAML text (a valid definition's text cut and spliced with
    hostile snippets, or hostile documents: alias bombs, recursion, deep nests, non-mappings,
    tags) loads or fails with InvalidArgument, quickly."""
    text = yaml.safe_dump(VALID[kind], sort_keys=data.draw(st.booleans()))
    for _ in range(data.draw(st.integers(0, 3))):
        start = data.draw(st.integers(0, len(text)))
        end = data.draw(st.integers(start, min(len(text), start + 12)))
        text = text[:start] + data.draw(texts | st.sampled_from(HOSTILE_DOCS)) + text[end:]
    if data.draw(st.integers(0, 4)) == 0:
        text = data.draw(st.sampled_from(HOSTILE_DOCS))
    check_outcome(lambda: StreamDefinition.from_yaml(text))


@settings(derandomize=True, deadline=None, max_examples=80, suppress_health_check=QUIET)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_definition_files_through_the_cli_exit_2_or_create(kind: str, data: st.DataObject):
    """Issue 14, fuzzed input: `cdcflow streams create FILE` with a file of any bytes (UTF-8,
    UTF-16, Latin-1, bytes spliced in) creates the stream or exits with status 2 and a typed
    JSON error; never a traceback."""
    text = yaml.safe_dump(VALID[kind], allow_unicode=True)
    encoded = text.encode(data.draw(st.sampled_from(["utf-8", "utf-16", "latin-1"])))
    cut = data.draw(st.integers(0, len(encoded)))
    encoded = encoded[:cut] + data.draw(st.binary(max_size=6)) + encoded[cut:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stream.yaml"
        path.write_bytes(encoded)
        result = CliRunner().invoke(streams, ["--catalog", f"{folder}/catalog.db", "create",
                                              str(path), "--json"])
        assert result.exit_code in (0, 2), (result.exception, result.output)
        if result.exit_code == 2:
            body = json.loads(result.output)
            assert body["error"] == "InvalidArgument" and "definition" in body["message"]
        else:
            check_usable(StreamDefinition.from_file(path))


# ---- CDC-table appends ----------------------------------------------------------------------

KEYS = {"INT64": [0, 1, 2, -1], "STRING": ["a", "b", "c", "", "a\x1fb", "b\x1fc", "1:a"],
        "FLOAT64": [0.0, -0.0, 1.5, math.inf], "BOOL": [True, False],
        "BYTES": [b"", b"a", b"\xff", b"a\x1f", b"1:"],
        "DATE": [date(1970, 1, 1), date(2024, 2, 29), date(1, 1, 1)],
        "TIMESTAMP": [datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, 5, tzinfo=UTC)],
        "NUMERIC": [Decimal(0), Decimal("1.5"), Decimal("-0"), Decimal("1" * 29 + ".5")],
        "ARRAY<INT64>": [[1], [1, 2]]}
GOOD = {"INT64": st.integers(-(2**63), 2**63 - 1), "STRING": st.text(max_size=5),
        "FLOAT64": st.floats(), "BOOL": st.booleans(), "BYTES": st.binary(max_size=5),
        "DATE": st.dates(), "TIMESTAMP": st.datetimes(timezones=st.just(UTC)),
        "NUMERIC": st.decimals(places=9, min_value=-(10**20), max_value=10**20),
        "ARRAY<INT64>": st.lists(st.integers(-3, 3) | st.none(), max_size=3),
        "ARRAY<STRING>": st.lists(st.text(max_size=2), max_size=3)}
DDL = {"STRING": "STRING(MAX)", "BYTES": "BYTES(MAX)", "ARRAY<STRING>": "ARRAY<STRING(MAX)>"}
NAIVE = [datetime(2020, 1, 1, 5, 6), datetime(2020, 1, 1)]  # noqa: DTZ001
BAD = [None, "x", "", "5", 1, 1.5, 1.0, -0.0, math.nan, math.inf, True, b"\xff", b"ok", 2**63,
       -(2**63) - 1, 10**40, Decimal("1.5"), Decimal("1.0000000001"), Decimal("NaN"),
       date(2020, 1, 1), *NAIVE, [1, "x"], [1.5], (1, 2), {"a": 1}]
NEAR = {"INT64": [1.5, Decimal("2.5"), 3.0, Decimal(4), -0.0], "TIMESTAMP": [1.5, 7, 2.0],
        "DATE": NAIVE, "ARRAY<INT64>": [b"ab", "ab", [1.5], (1, 2), [2.0]],
        "ARRAY<STRING>": [b"ab", "ab"], "FLOAT64": [True, 2**53 + 1, Decimal("0.1"), math.nan],
        "STRING": [b"ok", b"\xff", 5], "BYTES": ["text", 5], "BOOL": [1, 0, "true"],
        "NUMERIC": [0.5, Decimal("1e-10"), 10**29]}
FAULTS = {"type": [b"UPSERT", "upsert", "", "MERGE", 1, "DELETE ", b"INSERT"],
          "sequence": [b"1", "", "g", "1/2/3/4/5", "1" * 17, " 1", "1/", "-1", "0x1", 5, 1.5],
          "unknown": ["nope", 7, "_cdcflow_row", "_change_type"]}
VERSIONS = [-1, "1", 1.5, True, 2**63, 2**64, None, 0, 1, 2]
PSEUDO = {"type": "_CHANGE_TYPE", "sequence": "_CHANGE_SEQUENCE_NUMBER"}
sequences = st.lists(st.integers(0, 9) | st.integers(0, 2**64 - 1), min_size=1, max_size=4).map(
    lambda parts: "/".join(f"{p:x}" for p in parts))


def canon(value: Any, kind: str) -> Any:
    """The value a row means: what reading it back must give (equal in Python)."""
    if kind.startswith("ARRAY") and isinstance(value, list | tuple):
        return [canon(v, kind[6:-1]) for v in value]
    if isinstance(value, float | Decimal) and kind in ("INT64", "TIMESTAMP", "DATE") and \
            math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, bool) or value is None:
        return value
    if (isinstance(value, bytes) and kind == "STRING") or (isinstance(value, str) and
                                                           kind == "BYTES"):
        return value.decode(errors="replace") if isinstance(value, bytes) else value.encode()
    if kind in ("TIMESTAMP", "DATE") and isinstance(value, int) and abs(value) < 2**31:
        epoch = datetime(1970, 1, 1, tzinfo=UTC)  # Arrow's epoch micros and epoch days
        return epoch + timedelta(microseconds=value) if kind == "TIMESTAMP" else \
            (epoch + timedelta(days=value)).date()
    if kind == "TIMESTAMP" and isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if kind == "DATE" and isinstance(value, datetime) and value.time() == datetime.min.time():
        return value.date()
    return value


def norm(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return tuple(norm(v) for v in value) if isinstance(value, list | tuple) else value


def tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class Model:
    """The rows a CDC table must hold: per key, the greatest (sequence, append, row) wins."""

    def __init__(self, columns: list[tuple[str, str, bool]]) -> None:
        self.columns, self.rows, self.appends, self.exact = columns, {}, 0, True
        self.keys = [name for name, _, key in columns if key]
        self.kinds = {name: kind for name, kind, _ in columns}

    def add(self, rows: list[Row], cast: pa.Table | None) -> None:
        self.appends += 1
        for index, row in enumerate(rows):
            meant = {n: cast.column(n)[index].as_py() if cast is not None and n in
                     cast.column_names else canon(row.get(n), kind)
                     for n, kind in self.kinds.items()}
            key = tuple(norm(meant[k]) for k in self.keys)
            order = (sort_key_of(row.get("_CHANGE_SEQUENCE_NUMBER")), self.appends, index)
            if key not in self.rows or self.rows[key][0] < order:
                self.rows[key] = (order, None if row.get("_CHANGE_TYPE") == "DELETE" else meant)

    def check(self, table: pa.Table) -> None:
        found = [{n: norm(v) for n, v in r.items()} for r in table.to_pylist()]
        keys = [tuple(r[k] for k in self.keys) for r in found]
        assert len(set(keys)) == len(keys), f"a key appears twice: {keys}"
        if self.exact:
            expected = {k: {n: norm(v) for n, v in row.items()}
                        for k, (_, row) in self.rows.items() if row is not None}
            assert dict(zip(keys, found, strict=True)) == expected


def must_fail(rows: list[Row], model: Model, mode: str | None, names: list[Any],
              extra: dict[str, Any]) -> bool:
    """Whether the append breaks a rule that no type conversion mends."""
    if len(set(names)) != len(names) or not set(names) <= {*model.kinds, *PSEUDO.values()}:
        return True
    version = extra.get("version")
    if extra.get("app_id") is not None and (not isinstance(extra["app_id"], str) or not (
            type(version) is int and 0 <= version < 2**63)):
        return True
    types = {r.get("_CHANGE_TYPE") for r in rows}
    plain, cdc = types & {None, "INSERT"}, types & {"UPSERT", "DELETE"}
    if not types <= {None, "INSERT", "UPSERT", "DELETE"} or (plain and cdc) or \
            (mode is not None and rows and mode != ("cdc" if cdc else "plain")):
        return True
    for row in rows:
        if any(row.get(k) is None or norm(row[k]) == "NaN" for k in model.keys):
            return True
        try:
            ChangeSequenceNumber.parse(row.get("_CHANGE_SEQUENCE_NUMBER") or "0")
        except CdcflowError:
            return True
    return False


def draw_rows(data: st.DataObject, model: Model, mode: str) -> list[Row]:
    """0 to 6 good rows, plus two twins: distinct keys (u + sep + w, x) and (u, w + sep + x)
    that a composite key joined with `sep` would take for one."""
    rows = []
    for _ in range(data.draw(st.integers(0, 6))):
        row = {n: data.draw(st.sampled_from(KEYS[t]) if key else GOOD[t] | st.none())
               for n, t, key in model.columns}
        row["_CHANGE_TYPE"] = data.draw(st.sampled_from(
            ["UPSERT", "DELETE"] if mode == "cdc" else ["INSERT", None]))
        row["_CHANGE_SEQUENCE_NUMBER"] = data.draw(st.none() | sequences)
        rows.append({k: v for k, v in row.items() if v is not None or data.draw(st.booleans())})
    kinds = [model.kinds[k] for k in model.keys[:2]]
    if not rows or len(kinds) < 2 or not set(kinds) <= {"STRING", "BYTES"}:
        return rows
    sep, u, (w, x) = data.draw(st.sampled_from(["\x1f", "\x00", ":", "|", ","])), data.draw(
        st.sampled_from(["t", "u"])), data.draw(st.tuples(*[st.sampled_from(["", "1", ":"])] * 2))
    base = rows[-1] | {"_CHANGE_TYPE": "INSERT" if mode == "plain" else "UPSERT"}
    return rows + [base | {f"k{i}": v.encode() if kind == "BYTES" else v
                           for i, (v, kind) in enumerate(zip(pair, kinds, strict=True))}
                   for pair in [(u + sep + w, x), (u, w + sep + x)]]


def corrupt(data: st.DataObject, rows: list[Row], model: Model) -> dict[str, Any]:
    """None, 1-2 bad values, or 1-2 faults of any kind: bad values, missing or NULL keys, bad
    change types and sequences, unknown or non-text columns. Returns the append's extra
    arguments: sometimes an app id and a version, good or bad."""
    extra: dict[str, Any] = {}
    if data.draw(st.integers(0, 3)) == 0:
        extra = {"app_id": data.draw(st.sampled_from(["app", "app", 5])),
                 "version": data.draw(st.sampled_from(VERSIONS))}
    faults = data.draw(st.sampled_from(["none", "values", "any"]))
    for _ in range(0 if faults == "none" else data.draw(st.integers(1, 2))):
        fault = "value" if faults == "values" else data.draw(st.sampled_from(
            ["value", "omit", *FAULTS]))
        row = rows[data.draw(st.integers(0, len(rows) - 1))] if rows else {}
        column = data.draw(st.sampled_from(list(model.kinds)))
        bad = data.draw(st.sampled_from(FAULTS.get(fault, BAD)))
        if fault == "value":
            near = st.sampled_from(NEAR[model.kinds[column]])
            row[column] = data.draw(st.sampled_from(BAD) | near | near)
            row["_CHANGE_TYPE"] = {"DELETE": "UPSERT"}.get(row.get("_CHANGE_TYPE"),
                                                           row.get("_CHANGE_TYPE"))
        elif fault == "omit":
            row.pop(column, None)
        elif fault in PSEUDO:
            row[PSEUDO[fault]] = bad
        else:
            row[bad] = 1
    return extra


def package(data: st.DataObject, rows: list[Row], schema: pa.Schema
            ) -> tuple[Any, list[Row], list[Any], pa.Table | None]:
    """The rows as a list of dicts, a pyarrow Table or a pandas DataFrame (maybe with a column
    twice); the rows and column names it carries; its columns cast as an append casts them."""
    names = list(dict.fromkeys(n for row in rows for n in row))
    form = data.draw(st.sampled_from(["list"] * 5 + ["arrow"] * 2 + ["pandas"]))
    twice = data.draw(st.integers(0, 2)) == 0
    if form == "list" or not rows or not all(isinstance(n, str) for n in names):
        return rows, rows, names, None
    if form == "pandas":
        frame = pd.DataFrame(rows)
        if twice:
            return pd.concat([frame, frame.iloc[:, :1]], axis=1), rows, [*names, names[0]], None
        return frame, rows, names, None
    try:
        arrow = pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return rows, rows, names, None
    try:
        cast = pa.table({n: arrow.column(n).cast(schema.field(n).type)
                         for n in arrow.column_names if n in schema.names})
    except pa.ArrowException:
        cast = None  # the append must fail: a column does not cast
    rows = arrow.to_pylist()  # the first row's columns only
    if twice:
        arrow = arrow.append_column(arrow.column_names[0], arrow.column(0))
    return arrow, rows, arrow.column_names, cast


def append_once(data: st.DataObject, table: CdcTable, connection: Any, model: Model,
                mode: str | None) -> str | None:
    """One fuzzed append: a typed failure with the files unchanged, or the model updated.
    Returns the connection's mode ("cdc" or "plain") after it."""
    rows = draw_rows(data, model, mode or data.draw(st.sampled_from(["cdc", "plain"])))
    extra = corrupt(data, rows, model)
    payload, rows, names, cast = package(data, rows, table.schema)
    doomed, before = must_fail(rows, model, mode, names, extra), tree_hash(table.root)
    try:
        written = connection.append(payload, **extra)
    except CdcflowError as error:
        assert tree_hash(table.root) == before, f"a failed append changed files: {error}"
        assert any(word in str(error) for word in ["column", "CHANGE", "version", "app_id",
                                                   "append", "row"]), str(error)
        return mode
    assert not doomed, f"accepted a bad append: {rows} {extra}"
    model.exact = model.exact and not isinstance(payload, pd.DataFrame)
    if written and rows:
        model.add(rows, cast)
    types = {r.get("_CHANGE_TYPE") for r in rows}
    return mode if not rows else ("cdc" if types & {"UPSERT", "DELETE"} else "plain")


@settings(derandomize=True, deadline=None, max_examples=130, suppress_health_check=QUIET)
@given(data=st.data())
def test_fuzzed_appends_fail_typed_keep_files_and_apply(data: st.DataObject):
    """Issue 14, fuzzed input: random schemas (every column type, composite keys) take random
    appends (wrong types, NULL or missing keys, bad or mixed _CHANGE_SEQUENCE_NUMBER and
    _CHANGE_TYPE, modes mixed across appends, unknown or repeated columns, bad app versions)
    as lists, Arrow tables or DataFrames. Each fails typed with the table's files unchanged, or
    reads back as meant; a later good append and apply still work."""
    kinds = st.sampled_from(sorted(KEYS)) | st.sampled_from(["STRING", "BYTES", "FLOAT64"])
    columns = [(f"k{i}", t, True) for i, t in enumerate(
        data.draw(st.lists(kinds, min_size=1, max_size=2)))] + [
        (f"c{i}", t, False) for i, t in enumerate(
            data.draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=3)))]
    ddl = ", ".join(f"{n} {DDL.get(t, t)}" for n, t, _ in columns)
    with tempfile.TemporaryDirectory() as folder:
        try:
            table = CdcTable.create(Path(folder) / "t", ddl, [n for n, _, k in columns if k],
                                    clock=FakeClock(), deletion_vectors=data.draw(st.booleans()),
                                    target_file_rows=data.draw(st.sampled_from([1, 2, 1000])))
        except CdcflowError as error:
            assert "ARRAY" in ddl and "key" in str(error), str(error)
            return
        model, connection, mode = Model(columns), table.connection(), None
        for _ in range(data.draw(st.integers(1, 4))):
            mode = append_once(data, table, connection, model, mode)
            if data.draw(st.booleans()):
                table.apply()
            model.check(table.to_arrow())
        good = draw_rows(data, model, mode or "cdc")
        assert connection.append(good) is True
        model.add(good, None)
        table.apply()
        model.check(table.to_arrow())


@settings(derandomize=True, deadline=None, max_examples=150, suppress_health_check=QUIET)
@given(data=st.data())
def test_appended_values_read_back_as_meant(data: st.DataObject):
    """Issue 14, fuzzed input: a table with a column of every type takes rows of mostly good
    values, some near ones (integral floats, fractions, datetimes for dates, text for arrays)
    and wrong ones. An append fails typed with the files unchanged, or reads back as meant."""
    columns = [("k", "INT64", True)] + [(f"c{i}", t, False) for i, t in enumerate(sorted(GOOD))]
    with tempfile.TemporaryDirectory() as folder:
        table = CdcTable.create(Path(folder) / "t", ", ".join(
            f"{n} {DDL.get(t, t)}" for n, t, _ in columns), ["k"], clock=FakeClock())
        value = st.integers(0, 24).flatmap  # 1 in 25 wrong, 3 in 25 near, the rest good
        rows = [{n: index if key else data.draw(value(lambda n, t=t: st.sampled_from(
            BAD if n == 0 else NEAR[t]) if n < 4 else GOOD[t])) for n, t, key in columns}
            for index in range(data.draw(st.integers(1, 4)))]
        before, model = tree_hash(table.root), Model(columns)
        try:
            table.connection().append(rows)
        except CdcflowError as error:
            assert tree_hash(table.root) == before and "row" in str(error), str(error)
            return
        model.add(rows, None)
        model.check(table.to_arrow())
