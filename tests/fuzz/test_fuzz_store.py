"""The embedded database's public entry points, fuzzed (issue 14, fuzzed input).

DDL text, transactions of mutations, READ_<stream> arguments (`read_change_stream`,
`execute_sql`) and the shard/iterator API get generated input, valid and mutated. Each input
succeeds, or raises a `CdcflowError` whose message names the offending value and states the
rule (ARCHITECTURE invariant 6); any other exception is a bug and fails the test.

After a failed call the database file and its -wal file must be byte-for-byte what they were
before. Raw bytes are compared, not an `iterdump()`, and they are reliable here: in WAL mode the
main file changes only at a checkpoint, which SQLite runs only after a commit; the -wal file
gains frames only at a commit, or when dirty pages overflow the page cache (these transactions
are far smaller); a rollback writes neither, and readers write only the -shm index, not
compared. The change log (`_log`, `_partitions`) is in the same file, so the bytes cover it.
Each example runs on a fresh copy of one template database with a fake clock, so a failure
replays exactly.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cdcflow import COMMIT_TIMESTAMP, Database, FakeClock
from cdcflow.errors import CdcflowError
from cdcflow.model.schema import VALUE_CAPTURE_TYPES, TableSchema
from cdcflow.model.types import ColumnType
from cdcflow.store.ddl import CreateTable, parse_ddl
from cdcflow.store.mutations import KINDS

pytestmark = pytest.mark.property
BUILT = datetime(2026, 1, 1, 12, tzinfo=UTC)
NOW = BUILT + timedelta(minutes=10)
BASE_DDL = [
    "CREATE TABLE T (K INT64 NOT NULL, S STRING(5), B BYTES(3), F FLOAT64, D DATE, N NUMERIC, "
    "J JSON, A ARRAY<INT64>, Words ARRAY<STRING(4)>, Flag BOOL, TS TIMESTAMP, "
    "CT TIMESTAMP OPTIONS (allow_commit_timestamp = true), Req STRING(MAX) NOT NULL) "
    "PRIMARY KEY (K)",
    "CREATE TABLE M (Region STRING(8) NOT NULL, Id INT64 NOT NULL, Day DATE, Tag BYTES(MAX), "
    "Price FLOAT64) PRIMARY KEY (Region, Id DESC)",
    # Label is ill-typed on purpose (CONCAT of a STRING and an INT64): it fails at commit.
    "CREATE TABLE Gen (Id INT64 NOT NULL, First STRING(MAX), Last STRING(MAX), Num INT64, "
    "Shard INT64 AS (MOD(FARM_FINGERPRINT(CONCAT(First, Last)), 19)) STORED, "
    "Label STRING(MAX) AS (CONCAT(First, Num)) STORED) PRIMARY KEY (Id)",
    "CREATE TABLE Stamped (At TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true), "
    "V INT64) PRIMARY KEY (At)",
    "CREATE TABLE Keys (F FLOAT64 NOT NULL, B BYTES(4) NOT NULL, D DATE NOT NULL, "
    "N NUMERIC NOT NULL, V STRING(MAX)) PRIMARY KEY (F, B, D, N)",
    "CREATE NULL_FILTERED INDEX ByFlag ON T (Flag, TS)",
    "CREATE INDEX ByDay ON M (Day)",
    "CREATE CHANGE STREAM Everything FOR ALL",
    "CREATE CHANGE STREAM Narrow FOR T(S, F), M OPTIONS (retention_period = '2h', "
    "value_capture_type = 'NEW_ROW')",
]
SCHEMAS: dict[str, TableSchema] = {
    s.schema.name: s.schema for s in map(parse_ddl, BASE_DDL) if isinstance(s, CreateTable)}
SEED_ROWS = [
    ("T", {"K": 1, "Req": "r", "S": "abc", "Flag": True, "TS": BUILT}),
    ("M", {"Region": "eu", "Id": 1, "Day": date(2026, 1, 1)}),
    ("Gen", {"Id": 1, "First": "Ada", "Last": "Lovelace"}),
    ("Stamped", {"At": BUILT, "V": 1}),
    ("Keys", {"F": 1.5, "B": b"k", "D": date(2026, 1, 1), "N": Decimal("1.5")}),
]


def fuzz(examples: int) -> settings:
    return settings(derandomize=True, deadline=None, database=None, max_examples=examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- a template database, and a fresh copy of it per example -------------------------------

@dataclass(frozen=True)
class Template:
    path: Path
    pools: dict[str, tuple[str, ...]]
    """Real values to fuzz with: partition tokens, shard stream ids, shard ids, iterators."""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("fuzz_store") / "template.db"
    db = Database.open(path, clock=FakeClock(BUILT))
    db.ddl(BASE_DDL)
    stream_ids = [str(db.update_table(table, True)) for table in ("T", "M")]
    _insert(db, SEED_ROWS)
    db.split_partition("Everything", db.partitions("Everything")[0].token)
    shard_stream = next(s for s in db._catalog().streams if s.startswith("__shard_T"))
    db.split_partition(shard_stream, db.partitions(shard_stream)[0].token)
    _insert(db, [("T", {"K": k, "Req": "r"}) for k in range(2, 6)])
    shards = [(sid, s.shard_id) for sid in stream_ids for s in db.describe_stream(sid).shards]
    iterators = []
    for stream_id, shard_id in shards:
        iterators.append(db.get_shard_iterator(stream_id, shard_id))
        iterators.append(db.get_stream_record(iterators[-1], limit=1)[1] or "")
    tokens = [p.token for s in ("Everything", "Narrow", shard_stream) for p in db.partitions(s)]
    db.close()
    return Template(path, {"token": tuple(tokens), "stream_id": tuple(stream_ids),
                           "shard": tuple(s for _, s in shards), "iterator": tuple(iterators)})


def _insert(db: Database, rows: list[tuple[str, dict[str, Any]]]) -> None:
    with db.transaction() as tx:
        for table, row in rows:
            tx.insert(table, row)


_CASES = itertools.count()


@contextmanager
def fresh(template: Template) -> Iterator[Database]:
    path = template.path.with_name(f"case{next(_CASES)}.db")
    shutil.copyfile(template.path, path)
    db = Database.open(path, clock=FakeClock(NOW))
    try:
        yield db
    finally:
        db.close()
        for name in (str(path), f"{path}-wal", f"{path}-shm"):
            Path(name).unlink(missing_ok=True)


def file_bytes(db: Database) -> tuple[bytes, bytes]:
    wal = Path(f"{db.path}-wal")
    return Path(db.path).read_bytes(), wal.read_bytes() if wal.exists() else b""


def attempt(db: Database, call: Callable[[], object], needles: list[str]) -> bool:
    """Run `call`: True if it succeeds; False if it raised a CdcflowError that names one of
    `needles`, states a rule, and left the files as they were. Anything else propagates."""
    before = file_bytes(db)
    try:
        call()
    except CdcflowError as error:
        message = f"{type(error).__name__}: {error}"
        assert len(str(error).split()) >= 4, f"{message!r} states no rule"
        assert any(n in message for n in needles), f"{message!r} names none of {needles[:12]}"
        assert file_bytes(db) == before, f"{message!r}, yet the database file changed"
        event(type(error).__name__)
        return False
    event("succeeded")
    return True


# ---- values known only at run time, and what a message may name ----------------------------

class Giant:
    """An int too long for repr() (over 4300 digits); a marker keeps hypothesis's report short."""

    def __repr__(self) -> str:
        return "Giant(10**4400)"


@dataclass(frozen=True)
class Real:  # the index-th value of a template pool, its characters edited
    pool: str
    index: int
    edits: tuple[tuple[str, int, str], ...] = ()


@dataclass(frozen=True)
class Encoded:  # an iterator made by hand: base64 of the JSON of these parts
    parts: tuple[Any, ...]


def resolve(value: Any, template: Template) -> Any:
    if isinstance(value, Giant):
        return 10**4400
    if isinstance(value, Real):
        pool = template.pools[value.pool]
        return "".join(edited(list(pool[value.index % len(pool)]), value.edits))
    if isinstance(value, Encoded):
        parts = [resolve(p, template) for p in value.parts]
        return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode()
    if isinstance(value, dict):
        return {resolve(k, template): resolve(v, template) for k, v in value.items()}
    return value


def edited(parts: list[str], edits: tuple[tuple[str, int, str], ...]) -> list[str]:
    for op, at, piece in edits:
        i = at % (len(parts) + 1)
        if op == "insert":
            parts.insert(i, piece)
        elif op == "replace":
            parts[i:i + 1] = [piece]
        else:
            parts = parts[:i] + parts[i + 1:] if op == "delete" else parts[:i]
    return parts


def named(*values: Any, depth: int = 0) -> list[str]:
    """How a message may name each value (or a part of it): a repr prefix, or its text."""
    found: list[str] = []
    for value in values:
        if depth < 2 and isinstance(value, dict):
            found += named(*value.keys(), *value.values(), depth=depth + 1)
        elif depth < 2 and isinstance(value, list | tuple) and len(value) <= 8:
            found += named(*value, depth=depth + 1)
        if isinstance(value, int) and value.bit_length() > 14_000:
            found.append(f"{value.bit_length()} bits")
        with contextlib.suppress(ValueError, RecursionError):
            found.append(repr(value)[:16])
        if isinstance(value, str) and len(value) >= 3:
            found.append(value[:12])
        if isinstance(value, datetime) and value.tzinfo is not None:
            with contextlib.suppress(OverflowError):
                found.append(value.astimezone(UTC).isoformat()[:19])
    return [n for n in found if n]


TOKEN = re.compile(r"`[^`]*`|'[^']*'|\"[^\"]*\"|\w+|\S")


def words(text: Any) -> list[Any]:
    """The names, strings and numbers of DDL or SQL text, as a message may name them."""
    found: list[Any] = []
    for word in TOKEN.findall(text) if isinstance(text, str) else []:
        quoted = len(word) > 1 and word[0] in "`'\"" and word[-1] == word[0]
        found += [word[1:-1] if quoted else word, *re.findall(r"READ_(\w+)", word)]
        if re.fullmatch(r"[0-9]{1,400}", word):
            found.append(int(word))
    return found


# ---- strategies shared by the entry points ---------------------------------------------------

ODD_TEXT = ["", " ", "é", "名前", "\ud800", "a\udfffb", "\x00", "🙂", "a`b", "'", '"', "\n",
            "x" * 300, "٣", "9" * 5000]
TEXT = st.one_of(st.text(max_size=8), st.text(st.characters(exclude_categories=()), max_size=8),
                 st.sampled_from(ODD_TEXT))
IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
ZONES = st.builds(timezone, st.timedeltas(timedelta(hours=-23, minutes=-59),
                                          timedelta(hours=23, minutes=59)))
PIECES = st.one_of(TEXT, IDENT, st.sampled_from([
    "(", ")", ",", "<", ">", "=", ";", "`", "'", "NULL", "NOT", "PRIMARY KEY", "ARRAY<", "AS",
    "STORED", "-1", "1e400", "18446744073709551616", "9" * 5000, "=>", "@s", "A"]))
EDITS = st.lists(st.tuples(st.sampled_from(["insert", "delete", "replace", "truncate"]),
                           st.integers(0, 80), PIECES), min_size=1, max_size=3).map(tuple)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3), max_leaves=6)


class Deep(list[Any]):
    """A list nested thousands deep, with a short repr."""

    def __repr__(self) -> str:
        return "Deep(...)"


DEEP = Deep()
for _ in range(5000):
    DEEP = Deep([DEEP])
ODD_VALUES = [
    2**63, -(2**63) - 1, 10**400, Giant(), COMMIT_TIMESTAMP, {1: 1, "a": 2}, DEEP, [DEEP],
    Decimal("sNaN"), Decimal("Infinity"), Decimal("1" * 29 + "." + "1" * 10), "1e999999",
    bytearray(b"ab"), complex(1, 2), frozenset({1}), date.max, float("nan"), b"\x00" * 20,
    datetime.max.replace(tzinfo=timezone(timedelta(hours=-1))),
    datetime.min.replace(tzinfo=timezone(timedelta(hours=1))), [None], [[1]], (), "\ud800",
    Decimal("0E+50"), "9" * 5000]
BAD_VALUES = st.one_of(
    st.integers(), st.floats(), TEXT, st.binary(max_size=4), st.none(), st.booleans(),
    st.dates(), st.datetimes(), st.datetimes(timezones=ZONES), st.decimals(),
    st.lists(st.integers(), max_size=3), st.dictionaries(TEXT, st.integers(), max_size=2),
    st.sampled_from(ODD_VALUES))
NON_TEXT = st.sampled_from([None, 5, 2**70, ["x"], b"x", Giant()])


def real(pool: str, edits: bool = True) -> st.SearchStrategy[Real]:
    plain = st.builds(Real, st.just(pool), st.integers(0, 40))
    return plain | st.builds(Real, st.just(pool), st.integers(0, 40), EDITS) if edits else plain


# ---- transactions --------------------------------------------------------------------------

def good_values(ctype: ColumnType, key: bool = False) -> st.SearchStrategy[Any]:
    """Values of the column's type; key values often name rows that exist."""
    if ctype.code == "ARRAY":
        assert ctype.element is not None
        return st.lists(st.one_of(st.none(), good_values(ctype.element)), max_size=3)
    if key and ctype.code in ("INT64", "STRING"):
        return st.integers(0, 7) if ctype.code == "INT64" else st.sampled_from(["eu", "us"])
    return {
        "INT64": st.integers(-(2**63), 2**63 - 1), "FLOAT64": st.floats(), "BOOL": st.booleans(),
        "STRING": st.text(max_size=ctype.length or 8), "DATE": st.dates(),
        "BYTES": st.binary(max_size=ctype.length or 8), "JSON": JSON_VALUES,
        "TIMESTAMP": st.datetimes(timezones=st.just(UTC)),
        "NUMERIC": st.decimals(1 - 10**29, 10**29 - 1, allow_nan=False, places=9),
    }[ctype.code]


@st.composite
def row_values(draw: st.DrawFn, schema: TableSchema, kind: str, clean: bool) -> Any:
    if not clean and draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([None, [("K", 1)], "K=1", 5, {"K"}]))
    values: dict[Any, Any] = {}
    for column in schema.columns:
        keyed, needed = column.name in schema.primary_key, column.not_null and kind != "delete"
        chance = 10 if keyed or (clean and needed) else 0 if kind == "delete" else 5
        if (not clean or column.generated is None) and draw(st.integers(0, 9)) < chance:
            good = good_values(column.type, keyed)
            if column.allow_commit_timestamp:
                good |= st.just(COMMIT_TIMESTAMP)
            values[column.name] = draw(good if clean else st.one_of(good, good, BAD_VALUES))
    if not clean and draw(st.integers(0, 9)) == 0:
        values[draw(TEXT | st.sampled_from([1, None, Giant(), "k"]))] = draw(BAD_VALUES)
    return values


@st.composite
def transaction(draw: st.DrawFn) -> list[tuple[str, Any, Any]]:
    clean, names, ops = draw(st.booleans()), sorted(SCHEMAS), []
    for _ in range(draw(st.integers(1, 2 if clean else 4))):
        table = draw(st.sampled_from(names) if clean or draw(st.booleans()) else
                     TEXT | st.sampled_from([None, 7, ["T"], ("T",)]))
        schema = SCHEMAS[table if table in names else draw(st.sampled_from(names))]
        kind = draw(st.sampled_from(KINDS))
        ops.append((kind, table, draw(row_values(schema, kind, clean))))
    return ops


# ---- DDL -----------------------------------------------------------------------------------

KNOWN = st.sampled_from([
    "T", "M", "Gen", "Stamped", "Keys", "A", "B", "K", "S", "F", "J", "Flag", "TS", "Day", "Num",
    "First", "Everything", "Narrow", "ByFlag", "ByDay", "__shard_T_1", "__x", "Missing", "New"])
NUMBER = st.one_of(st.integers(0, 12), st.integers(0, 10**30), st.sampled_from(
    [2_621_440, 2_621_441, 10_485_761, -1])).map(str) | st.just("9" * 5000)
PLAIN_TYPES = st.sampled_from(["INT64", "FLOAT64", "BOOL", "DATE", "TIMESTAMP", "NUMERIC",
                               "STRING(MAX)", "BYTES(MAX)", "STRING(10)", "ARRAY<INT64>"])
WILD_TYPES = st.sampled_from(["JSON", "INT32", "STRING", "ARRAY<JSON>", "ARRAY<ARRAY<INT64>>",
                              "ARRAY<STRING(3)>"]) | NUMBER.map("STRING({})".format) | \
    NUMBER.map("BYTES({})".format) | PLAIN_TYPES
FUNCTIONS = st.sampled_from(["MOD", "CONCAT", "FARM_FINGERPRINT", "COALESCE", "NOPE"])
WILD_EXPRESSIONS = st.one_of(
    st.recursive(KNOWN | NUMBER | st.sampled_from(["TRUE", "'x'", "NULL"]), lambda inner: st.one_of(
        st.builds(lambda f, a: f"{f}({', '.join(a)})", FUNCTIONS, st.lists(inner, max_size=3)),
        st.builds("CASE WHEN {} THEN {} ELSE {} END".format, inner, inner, inner),
        inner.map("NOT {}".format), inner.map("{} IS NOT NULL".format), inner.map("({})".format)),
        max_leaves=6),
    st.builds(lambda n, e: "(" * n + e + ")" * n, st.sampled_from([3, 1500]), KNOWN),
    KNOWN.map(lambda e: "NOT " * 1500 + e))
OPTION_VALUES = st.one_of(
    st.builds("'{}{}'".format, NUMBER, st.sampled_from(["d", "h", "m", "s", "x", ""])),
    st.sampled_from([*VALUE_CAPTURE_TYPES, "ALL"]).map("'{}'".format),
    st.sampled_from(["true", "7", "NULL", "'٣d'"]))
OPTIONS = st.lists(st.tuples(st.sampled_from(["retention_period", "value_capture_type", "colour"]),
                             OPTION_VALUES), max_size=2).map(
    lambda pairs: f" OPTIONS ({', '.join(f'{k} = {v}' for k, v in pairs)})" if pairs else "")


def statements(name: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """DDL of every kind over these names, with odd types, options and expressions."""
    definition = st.builds(
        lambda n, t, g, o: f"{n} {t}" + (f" AS ({g}) STORED" if g else "") + o,
        st.sampled_from(["A", "B"]) | name, WILD_TYPES,
        st.one_of(st.none(), st.none(), WILD_EXPRESSIONS), st.sampled_from(
            ["", " NOT NULL", " OPTIONS (allow_commit_timestamp = true)",
             " OPTIONS (allow_commit_timestamp = maybe)", " OPTIONS (colour = 'red')"]))
    create = st.builds(lambda n, cs, key: f"CREATE TABLE {n} ({', '.join(cs)}) PRIMARY KEY "
                       f"({key})", name, st.lists(definition, max_size=4), name | st.sampled_from(
                           ["A", "A DESC", "A, B", ""]))
    scope = st.just("") | st.just(" FOR ALL") | st.lists(st.tuples(name, st.lists(
        name, max_size=2)), min_size=1, max_size=2).map(lambda tables: " FOR " + ", ".join(
            f"{t}({', '.join(c)})" if c else t for t, c in tables))
    return st.one_of(
        create, st.builds("ALTER TABLE {} ADD {}{}".format, name, st.sampled_from(
            ["COLUMN ", ""]), definition),
        st.builds("CREATE CHANGE STREAM {}{}{}".format, name, scope, OPTIONS),
        st.builds("ALTER CHANGE STREAM {} {}".format, name, scope.map("SET{}".format)
                  | OPTIONS.map("SET{}".format) | st.just("DROP FOR ALL")),
        st.builds("CREATE {}INDEX {} ON {} ({})".format, st.sampled_from(["", "NULL_FILTERED "]),
                  name, name, st.lists(name, max_size=3).map(", ".join)),
        st.builds("DROP {} {}".format, st.sampled_from(["TABLE", "CHANGE STREAM", "INDEX"]), name))


@st.composite
def plain_statement(draw: st.DrawFn) -> str:
    """A statement that mostly applies: tables and columns that exist, new names, good types."""
    table = SCHEMAS[draw(st.sampled_from(sorted(SCHEMAS)))]
    column = draw(st.sampled_from([c.name for c in table.non_key_columns if not c.generated]))
    new, ctype, key_type = draw(st.sampled_from(["New", "`odd name`"])), draw(PLAIN_TYPES), \
        draw(PLAIN_TYPES.filter(lambda t: not t.startswith("ARRAY")))
    options = draw(st.sampled_from(["", " OPTIONS (retention_period = '36h')",
                                    " OPTIONS (value_capture_type = 'NEW_ROW')"]))
    return draw(st.sampled_from([
        f"CREATE TABLE {new} (A {key_type} NOT NULL, B {ctype}, C BOOL AS (B IS NULL) STORED) "
        "PRIMARY KEY (A)",
        f"ALTER TABLE {table.name} ADD COLUMN {new} {ctype}",
        f"ALTER TABLE {table.name} ADD COLUMN {new} BOOL AS ({column} IS NOT NULL) STORED",
        f"CREATE CHANGE STREAM {new} FOR {table.name}({column}){options}",
        f"ALTER CHANGE STREAM {draw(st.sampled_from(['Everything', 'Narrow']))} SET"
        f"{options or ' FOR ALL'}",
        f"CREATE {draw(st.sampled_from(['', 'NULL_FILTERED ']))}INDEX {new} ON {table.name} "
        f"({column})",
        f"DROP INDEX {draw(st.sampled_from(['ByFlag', 'ByDay']))}", f"DROP TABLE {table.name}",
        f"DROP CHANGE STREAM {draw(st.sampled_from(['Everything', 'Narrow']))}"]))


WILD_STATEMENTS = statements(KNOWN | IDENT | TEXT.filter(lambda s: "`" not in s).map("`{}`".format))
DDL_INPUTS = st.one_of(
    plain_statement(), plain_statement(), plain_statement(), WILD_STATEMENTS,
    st.builds(lambda s, e: " ".join(edited(TOKEN.findall(s), e)), WILD_STATEMENTS, EDITS),
    TEXT, WILD_STATEMENTS.map(lambda s: [s]),
    st.sampled_from([None, 5, b"DROP TABLE T", [5], ("DROP INDEX ByDay",), {"DROP TABLE T"}]))


# ---- READ_<stream> and shard iterators -------------------------------------------------------

VALID_TIMES = st.integers(1, 600).map(lambda s: BUILT + timedelta(seconds=s))
TIMES = st.one_of(
    VALID_TIMES, VALID_TIMES.map(datetime.isoformat), st.floats(), TEXT, NON_TEXT, st.dates(),
    st.integers(-40 * 86_400, 86_400).map(lambda s: NOW + timedelta(seconds=s)),
    st.datetimes(timezones=st.just(UTC) | ZONES), st.datetimes(), st.sampled_from([
        "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "2026-01-01", "yesterday",
        "2026-13-01T00:00:00Z", datetime.max.replace(tzinfo=timezone(timedelta(hours=-2)))]))
HEARTBEATS = st.sampled_from([999, 1_000, 300_000, 300_001, True, 1000.0, "1000", None,
                              10**400, Giant()]) | st.integers()
BAD_ARGUMENTS = [st.sampled_from(["Missing", "__shard_T_1"]) | TEXT | NON_TEXT, TIMES,
                 st.none() | TIMES, st.none() | real("token") | TEXT | NON_TEXT, HEARTBEATS]
ARGUMENTS = ["start_timestamp", "end_timestamp", "partition_token", "heartbeat_milliseconds"]


@st.composite
def read_arguments(draw: st.DrawFn) -> list[Any]:
    """READ_<stream>'s arguments, all valid but for 0 to 2 of them."""
    arguments = [draw(st.sampled_from(["Everything", "Narrow"])), draw(VALID_TIMES),
                 draw(st.none() | VALID_TIMES), draw(st.none() | real("token", edits=False)),
                 draw(st.sampled_from([1_000, 10_000, 300_000]))]
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, 4))
        arguments[at] = draw(BAD_ARGUMENTS[at])
    return arguments


@st.composite
def change_stream_sql(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """The same arguments as a query: parameters, literals (named or not), or left out."""
    stream, *values = draw(read_arguments())
    texts, params = [], {}
    for name, value in zip(ARGUMENTS, values, strict=True):
        form = draw(st.sampled_from(["param", "param", "param", "literal", "positional", "none"]))
        literal = draw(st.sampled_from(["NULL", "1000", "-5", "9" * 5000, "'P1'", "٣"])
                       | st.integers().map(str) | TEXT.map("'{}'".format))
        params[name] = value
        texts += {"param": [f"{name} => @{name}"], "literal": [f"{name}=>{literal}"],
                  "positional": [literal], "none": []}[form]
    target = stream if isinstance(stream, str) else "Everything"
    sql = f"SELECT ChangeRecord FROM READ_{target}({', '.join(texts)})"
    if draw(st.integers(0, 3)) == 0:
        sql = " ".join(edited(TOKEN.findall(sql), draw(EDITS)))
    return sql, params


NUMBERS = st.integers() | st.floats() | st.booleans() | st.none() | TEXT | st.sampled_from(
    [10**30, -(10**30), 1 << 62, 1 << 63, -1, 0])
IDS = real("stream_id") | real("shard") | TEXT | st.sampled_from([None, 5, 2**70, ["x"]])
ITERATORS = st.one_of(
    real("iterator", edits=False), real("iterator", edits=False), real("iterator"), TEXT,
    st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()),
    JSON_VALUES.map(lambda v: Encoded((v,))), st.tuples(IDS, IDS, NUMBERS, NUMBERS, NUMBERS).map(
        Encoded), st.sampled_from(["", "=", "W10=", base64.b64encode(b"[" * 50_000).decode()]))
LIMITS = st.integers(1, 10) | st.integers(-5, 12_000) | st.sampled_from(
    [0, 10_000, 10_001, True, 2.5, "10", None, 10**400, Giant()])
SHARD_CALLS = st.one_of(
    st.tuples(st.just("get_stream_record"), ITERATORS, LIMITS),
    st.tuples(st.just("get_shard_iterator"), real("stream_id", edits=False) | IDS,
              real("shard", edits=False) | IDS),
    st.tuples(st.just("describe_stream"), real("stream_id", edits=False) | IDS))


def decoded(iterator: Any) -> list[Any]:
    """The parts an iterator holds, when it decodes at all (a message may name them)."""
    try:
        parts = json.loads(base64.urlsafe_b64decode(iterator))
    except (ValueError, TypeError, RecursionError):
        return []
    return parts if isinstance(parts, list) and len(parts) < 10 else []


# ---- the tests -------------------------------------------------------------------------------

@fuzz(600)
@given(statement=DDL_INPUTS)
def test_fuzzed_ddl_applies_or_fails_typed_writing_nothing(template: Template, statement: Any):
    """Issue 14, fuzzed input: DDL text, valid and mutated, with odd names, huge numbers and
    unicode. A statement that applies leaves a catalog that loads again."""
    texts = statement if isinstance(statement, list | tuple | set) else [statement]
    needles = named(statement, *texts, *[w for t in texts for w in words(t)])
    with fresh(template) as db:
        if attempt(db, lambda: db.ddl(statement), needles):
            reopened = Database.open(db.path, clock=FakeClock(NOW), create=False)
            for table in reopened.tables():
                reopened.table_schema(table)
            assert reopened.change_streams() is not None and reopened.indexes() is not None
            reopened.close()


@fuzz(600)
@given(operations=transaction())
def test_fuzzed_mutations_commit_or_fail_typed_writing_nothing(
        template: Template, operations: list[tuple[str, Any, Any]]):
    """Issue 14, fuzzed input: transactions of mutations on random tables, with wrong-typed and
    out-of-range values, bad timestamps, missing keys and unknown columns. A transaction that
    commits leaves rows and change records that read back."""
    ops = [(kind, table, resolve(values, template)) for kind, table, values in operations]
    needles = named(*[part for op in ops for part in op[1:]])
    needles += [repr(c.name) for s in SCHEMAS.values() for c in s.columns]
    stamps: list[datetime] = []
    with fresh(template) as db:
        def commit() -> None:
            with db.transaction() as tx:
                for kind, table, values in ops:
                    getattr(tx, kind)(table, values)
            stamps.append(tx.commit_timestamp or NOW)

        if attempt(db, commit, needles):
            for table in {table for _, table, _ in ops}:
                db.scan(table)
            for partition in db.partitions("Everything"):
                if partition.state == "ACTIVE":
                    list(db.read_change_stream("Everything", stamps[0], stamps[0],
                                               partition.token, 1_000))


@fuzz(500)
@given(call=read_arguments().map(lambda a: ("read", a)) | change_stream_sql().map(
    lambda q: ("sql", q)))
def test_fuzzed_change_stream_query_reads_or_fails_typed(template: Template, call: Any):
    """Issue 14, fuzzed input: READ_<stream> arguments (stream, start and end timestamps,
    partition tokens real and mutated, heartbeat milliseconds), through `read_change_stream`
    and through the SQL form. A valid query's first records are read too."""
    form, args = call
    with fresh(template) as db:
        if form == "read":
            values = [resolve(a, template) for a in args]
            needles = named(*values, *ARGUMENTS)
            query = lambda: db.read_change_stream(*values)  # noqa: E731
        else:
            sql, params = args[0], resolve(args[1], template)
            needles = named(sql, *words(sql), *params.values(), *ARGUMENTS)
            query = lambda: db.execute_sql(sql, params)  # noqa: E731
        attempt(db, lambda: list(itertools.islice(query(), 2)), needles)


@fuzz(500)
@given(call=SHARD_CALLS)
def test_fuzzed_shard_iterators_read_or_fail_typed(template: Template, call: Any):
    """Issue 14, fuzzed input: shard iterators random, hand-made and mutated from real ones,
    limits, stream and shard ids. An iterator returned by a read reads again."""
    method, *args = call
    values = [resolve(a, template) for a in args]
    found: list[Any] = []
    with fresh(template) as db:
        if attempt(db, lambda: found.append(getattr(db, method)(*values)),
                   named(*values, *decoded(values[0]))) and method == "get_stream_record":
            following = found[0][1]
            assert following is None or db.get_stream_record(following, 5) is not None
