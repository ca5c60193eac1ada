"""Read-write transactions: mutations are buffered, validated early, applied at commit."""

from __future__ import annotations

from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cdcflow.errors import FailedPrecondition
from cdcflow.model.types import check_text
from cdcflow.store.mutations import Mutation, as_row, validate_mutation

if TYPE_CHECKING:
    from cdcflow.store.database import Database


class Transaction:
    """Use as `with db.transaction() as tx:`; commits on exit, discards on an exception.

    Each mutation is checked against the schema when buffered (unknown table or column, type,
    NOT NULL), so a bad value raises at the call. Row existence (duplicate insert, missing row)
    is checked at commit, which then writes nothing. `commit_timestamp` is set after commit.
    """

    def __init__(self, database: Database) -> None:
        self._database = database
        self._mutations: list[Mutation] = []
        self._done = False
        self.commit_timestamp: datetime | None = None

    def _buffer(self, kind: str, table: str, values: dict[str, Any]) -> None:
        if self._done:
            raise FailedPrecondition("this transaction has already committed or rolled back")
        schema = self._database.table_schema(check_text(table, "table name"))
        row = as_row(kind, table, values)
        self._mutations.append(validate_mutation(schema, Mutation(kind, table, row)))

    def insert(self, table: str, values: dict[str, Any]) -> None:
        self._buffer("insert", table, values)

    def update(self, table: str, values: dict[str, Any]) -> None:
        self._buffer("update", table, values)

    def insert_or_update(self, table: str, values: dict[str, Any]) -> None:
        self._buffer("insert_or_update", table, values)

    def replace(self, table: str, values: dict[str, Any]) -> None:
        self._buffer("replace", table, values)

    def delete(self, table: str, key: dict[str, Any]) -> None:
        self._buffer("delete", table, key)

    def commit(self) -> datetime:
        if self._done:
            raise FailedPrecondition("this transaction has already committed or rolled back")
        self._done = True
        self.commit_timestamp = self._database._commit(self._mutations)
        return self.commit_timestamp

    def rollback(self) -> None:
        self._done = True
        self._mutations.clear()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.rollback()
        elif not self._done:
            self.commit()
