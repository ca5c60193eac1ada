"""The project's catalog: stream definitions, states, status and errors in one SQLite file,
so a restarted runner resumes every RUNNING stream. State changes go through
`cdcflow.streams.states.transition` inside a write transaction.

Each creation of a stream has an id of its own (the status entry `created`), so that a
runner's work for a stream that was deleted meanwhile, and perhaps created again under its
name, cannot write into the new stream's status: it writes through `Catalog.scoped`, whose
every transaction first checks that the stream is still that creation (else StreamGone)."""

from __future__ import annotations

import copy
import json
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from cdcflow.model.timestamps import to_micros
from cdcflow.store.sqlite import connect, write_transaction
from cdcflow.streams.definition import StreamDefinition, folded_name
from cdcflow.streams.states import StreamState, check_deletable, transition

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS streams (name TEXT PRIMARY KEY, definition TEXT NOT NULL, "
    "state TEXT NOT NULL, changed REAL NOT NULL, retries INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS status (stream TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, PRIMARY KEY (stream, key))",
    "CREATE TABLE IF NOT EXISTS errors (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "stream TEXT NOT NULL, at REAL NOT NULL, object TEXT NOT NULL, message TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS runner_lease (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "holder TEXT NOT NULL, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS identity (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "value TEXT NOT NULL)",
]


@dataclass(frozen=True, slots=True)
class StreamRecord:
    definition: StreamDefinition
    state: StreamState
    changed: float
    retries: int
    creation: str | None = None
    """This creation's id (None: a stream created by a cdcflow before creations had one)."""

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True, slots=True)
class UnreadableStream:
    """A stream whose stored definition (or state) this version cannot read: its name, its
    state as stored (a StreamState's value, unless this version knows no such state), its
    retries and why (the parse error, naming the field)."""

    name: str
    state: str
    retries: int
    error: str


DRIVEN = frozenset({StreamState.STARTING, StreamState.RUNNING, StreamState.DRAINING,
                    StreamState.FAILED})
"""The states in which a runner drives a stream (or retries it)."""


CREATED = "created"
"""The status entry that holds a stream's creation id (not shown in `status`)."""


class StreamGone(NotFound):
    """A scoped catalog's stream was deleted, or deleted and created again. A NotFound, so
    that the code that catches it says so (`except NotFound` catches it too)."""


def _creation(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT value FROM status WHERE stream = ? AND key = ?",
                       (name, CREATED)).fetchone()
    return None if row is None else str(json.loads(row[0]))


def _known(name: str, state: str) -> StreamState:
    """A stored state as a StreamState; one this version does not know is FailedPrecondition
    (a newer cdcflow's)."""
    if state not in StreamState.__members__:
        raise FailedPrecondition(f"stream {name!r} is in state {state!r}, which this cdcflow "
                                 "does not know; run the cdcflow that set it")
    return StreamState(state)


def unreadable_message(stream: UnreadableStream) -> str:
    return (f"stream {stream.name!r}: this cdcflow cannot read its stored definition "
            f"({stream.error}); run the cdcflow that created it, or delete the stream "
            f"(`cdcflow streams delete {stream.name} --keep-slot`, then drop its slot and "
            "publication on the server, if it has them) and create it again")


def _check_distinct(definition: StreamDefinition, stored: list[tuple[str, str]]) -> None:
    """A new stream's name is none of the `stored` streams' (name, definition JSON) names,
    even to what it names (`folded_name`), and it holds nothing on its source server that
    one of them holds there (`held_on_source`)."""
    held = definition.held_on_source()
    for name, text in stored:
        if name == definition.name:
            raise AlreadyExists(f"stream {definition.name!r} exists already")
        if folded_name(name) == folded_name(definition.name):
            raise AlreadyExists(
                f"stream {definition.name!r} differs from stream {name!r} only in letter case "
                f"or in '-' against '_': the two would share their log, state and event "
                f"folders on a filesystem that folds case (macOS's by default), and from "
                f"PostgreSQL their default replication slot and publication "
                f"{definition.slot_name()!r}; choose another name")
        try:
            theirs = StreamDefinition.parse(json.loads(text)).held_on_source()
        except ValueError:  # another version's (or not JSON): its name is what it holds
            continue
        for field, mine in held.items():
            other = theirs.get(field)
            if other is None or other.value != mine.value:
                continue
            if shared := mine.servers & other.servers:
                raise AlreadyExists(
                    f"stream {definition.name!r} would use the {mine.what} {mine.value!r} on "
                    f"{', '.join(sorted(shared))} that stream {name!r} uses: each would take "
                    f"it from the other; set {field}")


class Catalog:
    """Open with `Catalog(path)`; safe for several processes. Times (state changes, errors)
    are the clock's, in epoch seconds."""

    def __init__(self, path: str | Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = str(path)
        self.clock = clock
        self.scope: tuple[str, str | None] | None = None
        """(stream, creation) for a `scoped` catalog."""
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._write() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO identity(id, value) VALUES (1, ?)",
                         (secrets.token_hex(16),))
            (identity,) = conn.execute("SELECT value FROM identity").fetchone()
        self.identity: str = identity
        """Made once, at the catalog's first open, and kept: it tells this catalog's streams
        from another catalog's of the same names (the writers of CDC tables)."""

    def scoped(self, name: str, creation: str | None) -> Catalog:
        """This catalog as one creation of stream `name` sees it: each of its transactions
        raises StreamGone, writing nothing, once the stream is deleted or another creation."""
        view = copy.copy(self)
        view.scope = (name, creation)
        return view

    def check_scope(self) -> None:
        """StreamGone if this is a scoped catalog whose stream is gone (else nothing)."""
        if self.scope is not None:
            with self._write():
                pass

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = connect(self.path)
        try:
            with write_transaction(conn):
                if self.scope is not None:
                    self._check_scope(conn, *self.scope)
                yield conn
        finally:
            conn.close()

    @staticmethod
    def _check_scope(conn: sqlite3.Connection, name: str, creation: str | None) -> None:
        if conn.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone() is None \
                or _creation(conn, name) != creation:
            raise StreamGone(f"stream {name!r} was deleted (and perhaps created again) since "
                             "this work for it began: it writes nothing more")

    def create(self, definition: StreamDefinition) -> None:
        with self._write() as conn:
            _check_distinct(definition,
                            conn.execute("SELECT name, definition FROM streams").fetchall())
            conn.execute("INSERT INTO streams(name, definition, state, changed) "
                         "VALUES (?, ?, ?, ?)", (definition.name, definition.model_dump_json(),
                                                 StreamState.NOT_STARTED.value, self._now()))
            for table in ("status", "errors"):  # what an earlier one's late writers left
                conn.execute(f"DELETE FROM {table} WHERE stream = ?", (definition.name,))
            conn.execute("INSERT INTO status(stream, key, value) VALUES (?, ?, ?)",
                         (definition.name, CREATED, json.dumps(secrets.token_hex(8))))

    def _row(self, conn: sqlite3.Connection, name: str) -> StreamRecord:
        row = conn.execute("SELECT definition, state, changed, retries FROM streams "
                           "WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"stream {name!r} does not exist")
        try:
            stored = json.loads(row[0])
        except ValueError as error:
            raise InvalidArgument(f"invalid stream definition: not JSON ({error})") from None
        return StreamRecord(StreamDefinition.parse(stored), _known(name, row[1]), row[2],
                            row[3], _creation(conn, name))

    def get(self, name: str) -> StreamRecord:
        with self._write() as conn:
            return self._row(conn, name)

    def streams(self) -> list[StreamRecord]:
        with self._write() as conn:
            names = [n for (n,) in conn.execute("SELECT name FROM streams ORDER BY name")]
            return [self._row(conn, n) for n in names]

    def records(self) -> list[StreamRecord | UnreadableStream]:
        """Every stream in name order, as `streams` gives them; one whose stored definition
        this version cannot read (a newer cdcflow's, say) as an UnreadableStream, so that
        it stops only itself."""
        with self._write() as conn:
            names = [n for (n,) in conn.execute("SELECT name FROM streams ORDER BY name")]
            return [self._record_or_unreadable(conn, n) for n in names]

    def _record_or_unreadable(self, conn: sqlite3.Connection, name: str
                              ) -> StreamRecord | UnreadableStream:
        try:
            return self._row(conn, name)
        except (InvalidArgument, FailedPrecondition) as error:  # a definition or a state
            state, retries = conn.execute("SELECT state, retries FROM streams WHERE name = ?",
                                          (name,)).fetchone()  # unknown to this version
            return UnreadableStream(name, state, retries, str(error))

    def give_up_unreadable(self, stream: UnreadableStream) -> bool:
        """Fail an unreadable stream that a runner would drive (STARTING, RUNNING, DRAINING
        or FAILED) permanently, with its error recorded; True if it was."""
        with self._write() as conn:
            found = self._record_or_unreadable(conn, stream.name)
            if not isinstance(found, UnreadableStream) or found.state not in DRIVEN:
                return False
            failed = StreamState.FAILED if found.state == StreamState.FAILED else \
                transition(StreamState(found.state), "fail")
            conn.execute("UPDATE streams SET state = ?, changed = ? WHERE name = ?",
                         (transition(failed, "give_up").value, self._now(), stream.name))
            conn.execute("INSERT INTO errors(stream, at, object, message) VALUES (?, ?, ?, ?)",
                         (stream.name, self._now(), "*", unreadable_message(found)))
        return True

    def _now(self) -> float:
        return to_micros(self.clock.now()) / 1e6

    def act(self, name: str, action: str, note: tuple[str, dict[str, Any]] | None = None
            ) -> StreamState:
        """Apply a state action; invalid ones raise naming the current state. `retries`
        counts consecutive failures: a retry adds one, a human's reset or resume clears it,
        and `healthy` clears it once a stream has run well for a while. `note` (key, values)
        is written to the status in the same transaction, with the time of the change, so
        that a reader can tell it belongs to the state the stream is in now."""
        with self._write() as conn:
            current = self._record_or_unreadable(conn, name)  # a human may pause it, say
            target = transition(_known(name, current.state), action)
            retries = current.retries + 1 if action == "retry" else (
                0 if action in ("reset", "resume", "start") else current.retries)
            now = self._now()
            conn.execute("UPDATE streams SET state = ?, changed = ?, retries = ? "
                         "WHERE name = ?", (target.value, now, retries, name))
            if note is not None:
                conn.execute("INSERT OR REPLACE INTO status(stream, key, value) VALUES "
                             "(?, ?, ?)", (name, note[0], json.dumps(note[1] | {"changed": now})))
            return target

    def take_lease(self, holder: str, seconds: float,
                   replacing: str | None = None) -> tuple[str, float]:
        """The runner lease: one runner drives the catalog's streams. `holder` takes it when
        it is free or expired, or held by `replacing` (a holder known to be dead), or renews
        its own, for `seconds`; returns who holds it now and until when (epoch seconds)."""
        with self._write() as conn:
            now = self._now()
            row = conn.execute("SELECT holder, expires FROM runner_lease WHERE id = 1").fetchone()
            if row is None or row[0] in (holder, replacing) or row[1] < now:
                conn.execute("INSERT OR REPLACE INTO runner_lease(id, holder, expires) VALUES "
                             "(1, ?, ?)", (holder, now + seconds))
                return holder, now + seconds
            return str(row[0]), float(row[1])

    def release_lease(self, holder: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM runner_lease WHERE holder = ?", (holder,))

    def lease(self) -> tuple[str, float] | None:
        with self._write() as conn:
            row = conn.execute("SELECT holder, expires FROM runner_lease WHERE id = 1").fetchone()
        return None if row is None else (str(row[0]), float(row[1]))

    def healthy(self, name: str) -> None:
        """The stream has run without failing long enough: its failures are forgiven."""
        with self._write() as conn:
            conn.execute("UPDATE streams SET retries = 0 WHERE name = ?", (name,))

    def delete(self, name: str) -> None:
        with self._write() as conn:
            check_deletable(_known(name, self._record_or_unreadable(conn, name).state))
            for table, column in (("streams", "name"), ("status", "stream"),
                                  ("errors", "stream")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))

    def record_error(self, name: str, object_name: str, message: str) -> None:
        with self._write() as conn:
            conn.execute("INSERT INTO errors(stream, at, object, message) VALUES (?, ?, ?, ?)",
                         (name, self._now(), object_name, message))

    def errors(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """Recent errors, newest first: the FetchStreamErrors analogue (EV-9)."""
        with self._write() as conn:
            self._record_or_unreadable(conn, name)  # NotFound for no such stream
            rows = conn.execute("SELECT at, object, message FROM errors WHERE stream = ? "
                                "ORDER BY id DESC LIMIT ?", (name, limit)).fetchall()
        return [{"time": at, "object": obj, "message": message} for at, obj, message in rows]

    def update_status(self, name: str, **values: Any) -> None:
        if CREATED in values:
            raise InvalidArgument(f"the status entry {CREATED!r} is the stream's creation id, "
                                  "made when it is created and never written after")
        with self._write() as conn:
            conn.executemany("INSERT OR REPLACE INTO status(stream, key, value) VALUES (?, ?, ?)",
                             [(name, k, json.dumps(v)) for k, v in values.items()])

    def status(self, name: str) -> dict[str, Any]:
        with self._write() as conn:
            record = self._record_or_unreadable(conn, name)
            rows = conn.execute("SELECT key, value FROM status WHERE stream = ?",
                                (name,)).fetchall()
        unreadable = {"unreadable": record.error} if isinstance(record, UnreadableStream) else {}
        return {"name": name, "state": str(record.state), "retries": record.retries,
                **unreadable, **{k: json.loads(v) for k, v in rows if k != CREATED}}
