"""A parser for the DDL subset of the embedded database.

Statements: CREATE TABLE (with stored generated columns), DROP TABLE, ALTER TABLE ... ADD
COLUMN, CREATE CHANGE STREAM, ALTER CHANGE STREAM (SET FOR / SET OPTIONS / DROP FOR ALL),
DROP CHANGE STREAM, CREATE [NULL_FILTERED] INDEX, DROP INDEX.
Parsing is pure: it returns statement values; `cdcflow.store.catalog` applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdcflow.errors import DdlError, show
from cdcflow.model.expressions import parse_expression
from cdcflow.model.schema import Column, TableSchema
from cdcflow.model.types import ColumnType, is_valid_text
from cdcflow.store.ddl_rules import checked_length, checked_schema

_TOKEN = re.compile(
    r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|`(?P<quoted>[^`]+)`|(?P<number>[0-9]+)"
    r"|'(?P<squote>[^']*)'|\"(?P<dquote>[^\"]*)\"|(?P<sym>[(),<>=;]))"
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ident, number, string, sym
    text: str


@dataclass(frozen=True, slots=True)
class CreateTable:
    schema: TableSchema


@dataclass(frozen=True, slots=True)
class DropTable:
    name: str


@dataclass(frozen=True, slots=True)
class AddColumn:
    table: str
    column: Column


@dataclass(frozen=True, slots=True)
class StreamScope:
    """What a change stream watches: FOR ALL, or tables each with an optional column list."""

    for_all: bool
    tables: tuple[tuple[str, tuple[str, ...] | None], ...]


@dataclass(frozen=True, slots=True)
class CreateChangeStream:
    name: str
    scope: StreamScope
    options: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AlterChangeStream:
    name: str
    scope: StreamScope | None
    options: tuple[tuple[str, str], ...] | None


@dataclass(frozen=True, slots=True)
class DropChangeStream:
    name: str


@dataclass(frozen=True, slots=True)
class CreateIndex:
    name: str
    table: str
    columns: tuple[str, ...]
    null_filtered: bool


@dataclass(frozen=True, slots=True)
class DropIndex:
    name: str


Statement = (
    CreateTable | DropTable | AddColumn | CreateChangeStream | AlterChangeStream
    | DropChangeStream | CreateIndex | DropIndex
)
_NOTHING = StreamScope(for_all=False, tables=())


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    stripped = text.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None or match.end() == position:
            raise DdlError(f"cannot parse DDL at {stripped[position:position + 30]!r} in {text!r}")
        position = match.end()
        if match["ident"] is not None:
            tokens.append(Token("ident", match["ident"]))
        elif match["quoted"] is not None:
            tokens.append(Token("quoted", match["quoted"]))
        elif match["number"] is not None:
            tokens.append(Token("number", match["number"]))
        elif match["squote"] is not None or match["dquote"] is not None:
            tokens.append(Token("string", match["squote"] or match["dquote"] or ""))
        else:
            tokens.append(Token("sym", match["sym"]))
    while tokens and tokens[-1] == Token("sym", ";"):
        tokens.pop()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0

    def error(self, expected: str) -> DdlError:
        found = self.tokens[self.index].text if self.index < len(self.tokens) else "end of input"
        return DdlError(f"expected {expected} but found {found!r} in DDL {self.text!r}")

    def peek_word(self) -> str | None:
        if self.index < len(self.tokens) and self.tokens[self.index].kind == "ident":
            return self.tokens[self.index].text.upper()
        return None

    def accept_word(self, *words: str) -> bool:
        saved = self.index
        for word in words:
            if self.peek_word() != word:
                self.index = saved
                return False
            self.index += 1
        return True

    def expect_word(self, *words: str) -> None:
        if not self.accept_word(*words):
            raise self.error(" ".join(words))

    def accept_sym(self, sym: str) -> bool:
        if self.index < len(self.tokens) and self.tokens[self.index] == Token("sym", sym):
            self.index += 1
            return True
        return False

    def expect_sym(self, sym: str) -> None:
        if not self.accept_sym(sym):
            raise self.error(repr(sym))

    def name(self) -> str:
        if self.index < len(self.tokens) and self.tokens[self.index].kind in ("ident", "quoted"):
            self.index += 1
            return self.tokens[self.index - 1].text
        raise self.error("a name")

    def value(self) -> str:
        if self.index < len(self.tokens) and self.tokens[self.index].kind != "sym":
            self.index += 1
            return self.tokens[self.index - 1].text
        raise self.error("an option value")

    def end(self) -> None:
        if self.index != len(self.tokens):
            raise self.error("end of statement")

    def column_type(self) -> ColumnType:
        word = self.peek_word()
        if word is None:
            raise self.error("a column type")
        self.index += 1
        if word == "ARRAY":
            self.expect_sym("<")
            element = self.column_type()
            self.expect_sym(">")
            if element.code == "ARRAY":
                raise DdlError(f"nested ARRAY types are not supported in DDL {self.text!r}")
            return ColumnType("ARRAY", element=element)
        if word in ("STRING", "BYTES"):
            self.expect_sym("(")
            size = self.value()
            self.expect_sym(")")
            if size.upper() == "MAX":
                return ColumnType(word)
            return ColumnType(word, length=checked_length(word, size))
        if word in ("INT64", "FLOAT64", "BOOL", "DATE", "TIMESTAMP", "NUMERIC", "JSON"):
            return ColumnType(word)
        raise DdlError(
            f"unknown column type {word!r} in DDL {self.text!r}; use INT64, FLOAT64, BOOL, "
            "STRING(n|MAX), BYTES(n|MAX), DATE, TIMESTAMP, NUMERIC, JSON or ARRAY<...>"
        )

    def options(self) -> tuple[tuple[str, str], ...]:
        self.expect_sym("(")
        pairs: list[tuple[str, str]] = []
        while True:
            key = self.name().lower()
            self.expect_sym("=")
            pairs.append((key, self.value()))
            if not self.accept_sym(","):
                break
        self.expect_sym(")")
        return tuple(pairs)

    def generated(self, column: str) -> str | None:
        """`AS (expression) STORED`: the expression's text, checked by its parser."""
        if not self.accept_word("AS"):
            return None
        self.expect_sym("(")
        depth, parts = 1, []
        while depth:
            if self.index >= len(self.tokens):
                raise self.error("')' closing the generated column's expression")
            token = self.tokens[self.index]
            self.index += 1
            depth += {"(": 1, ")": -1}.get(token.text, 0) if token.kind == "sym" else 0
            if depth:
                parts.append(_token_text(token))
        self.expect_word("STORED")
        text = " ".join(parts)
        try:
            parse_expression(text)
        except DdlError as error:
            raise DdlError(f"generated column {column!r}: {error}") from None
        return text

    def column(self) -> Column:
        name = self.name()
        ctype = self.column_type()
        generated = self.generated(name)
        not_null = self.accept_word("NOT", "NULL")
        allow_commit_timestamp = False
        if self.accept_word("OPTIONS"):
            for key, value in self.options():
                allowed = ("true", "false", "null")
                if key != "allow_commit_timestamp" or value.lower() not in allowed:
                    raise DdlError(
                        f"column option {key} = {value!r} is not supported; only "
                        "allow_commit_timestamp = true|false|null"
                    )
                allow_commit_timestamp = value.lower() == "true"
        if allow_commit_timestamp and ctype.code != "TIMESTAMP":
            raise DdlError(f"allow_commit_timestamp needs a TIMESTAMP column, not {name!r}")
        if generated is not None and (not_null or allow_commit_timestamp):
            raise DdlError(f"generated column {name!r} takes neither NOT NULL nor "
                           "allow_commit_timestamp")
        return Column(name, ctype, not_null, allow_commit_timestamp, generated)

    def create_table(self) -> CreateTable:
        name = self.name()
        self.expect_sym("(")
        columns: list[Column] = []
        while not self.accept_sym(")"):
            columns.append(self.column())
            if not self.accept_sym(","):
                self.expect_sym(")")
                break
        self.expect_word("PRIMARY", "KEY")
        self.expect_sym("(")
        key: list[str] = []
        while not self.accept_sym(")"):
            key.append(self.name())
            self.accept_word("ASC") or self.accept_word("DESC")
            if not self.accept_sym(","):
                self.expect_sym(")")
                break
        self.end()
        return CreateTable(checked_schema(name, columns, key))

    def scope(self) -> StreamScope:
        if self.accept_word("ALL"):
            return StreamScope(for_all=True, tables=())
        tables: list[tuple[str, tuple[str, ...] | None]] = []
        while True:
            table = self.name()
            columns: tuple[str, ...] | None = None
            if self.accept_sym("("):
                names: list[str] = []
                while not self.accept_sym(")"):
                    names.append(self.name())
                    if not self.accept_sym(","):
                        self.expect_sym(")")
                        break
                columns = tuple(names)
            tables.append((table, columns))
            if not self.accept_sym(","):
                break
        if len({t for t, _ in tables}) != len(tables):
            raise DdlError(f"a table is listed twice in the FOR clause of {self.text!r}")
        return StreamScope(for_all=False, tables=tuple(tables))

    def statement(self) -> Statement:
        if self.accept_word("CREATE", "TABLE"):
            return self.create_table()
        if self.accept_word("DROP", "TABLE"):
            name = self.name()
            self.end()
            return DropTable(name)
        if self.accept_word("ALTER", "TABLE"):
            table = self.name()
            self.expect_word("ADD")
            self.accept_word("COLUMN")
            column = self.column()
            self.end()
            return AddColumn(table, column)
        if self.accept_word("CREATE", "CHANGE", "STREAM"):
            name = self.name()
            scope = self.scope() if self.accept_word("FOR") else _NOTHING
            options = self.options() if self.accept_word("OPTIONS") else ()
            self.end()
            return CreateChangeStream(name, scope, options)
        if self.accept_word("ALTER", "CHANGE", "STREAM"):
            return self.alter_change_stream()
        if self.accept_word("DROP", "CHANGE", "STREAM"):
            name = self.name()
            self.end()
            return DropChangeStream(name)
        if self.accept_word("CREATE", "NULL_FILTERED", "INDEX"):
            return self.create_index(True)
        if self.accept_word("CREATE", "INDEX"):
            return self.create_index(False)
        if self.accept_word("DROP", "INDEX"):
            name = self.name()
            self.end()
            return DropIndex(name)
        raise self.error(
            "CREATE TABLE, DROP TABLE, ALTER TABLE, CREATE/ALTER/DROP CHANGE STREAM, "
            "CREATE [NULL_FILTERED] INDEX, DROP INDEX"
        )

    def create_index(self, null_filtered: bool) -> CreateIndex:
        name = self.name()
        self.expect_word("ON")
        table = self.name()
        self.expect_sym("(")
        columns = [self.name()]
        self.accept_word("ASC") or self.accept_word("DESC")
        while self.accept_sym(","):
            columns.append(self.name())
            self.accept_word("ASC") or self.accept_word("DESC")
        self.expect_sym(")")
        self.end()
        return CreateIndex(name, table, tuple(columns), null_filtered)

    def alter_change_stream(self) -> AlterChangeStream:
        name = self.name()
        if self.accept_word("DROP", "FOR", "ALL"):
            self.end()
            return AlterChangeStream(name, _NOTHING, None)
        self.expect_word("SET")
        if self.accept_word("FOR"):
            scope = self.scope()
            self.end()
            return AlterChangeStream(name, scope, None)
        self.expect_word("OPTIONS")
        options = self.options()
        self.end()
        return AlterChangeStream(name, None, options)


def _token_text(token: Token) -> str:
    """A token as expression text again (names quoted when they are not plain)."""
    if token.kind == "quoted":
        return f"`{token.text}`"
    if token.kind == "string":
        return f"'{token.text}'" if "'" not in token.text else f'"{token.text}"'
    return token.text


def statement_texts(statements: object) -> list[str]:
    """The statements of `Database.ddl`'s argument: one text, or a list or tuple of texts."""
    texts = [statements] if isinstance(statements, str) else statements
    if not isinstance(texts, list | tuple) or not all(isinstance(t, str) for t in texts):
        raise DdlError(f"DDL {show(statements)} ({type(statements).__name__}) is neither a "
                       "statement (str) nor a list of statements")
    return [text for text in texts if isinstance(text, str)]


def parse_ddl(text: str) -> Statement:
    """Parse one DDL statement; raise DdlError naming the bad token otherwise."""
    if not text.strip():
        raise DdlError(f"DDL statement {text!r} is empty; write one, such as CREATE TABLE ...")
    if not is_valid_text(text):
        raise DdlError(f"DDL statement {show(text)} holds a lone surrogate; DDL must be valid "
                       "Unicode (UTF-8)")
    return _Parser(text).statement()


def parse_duration_micros(text: str) -> int:
    """'7d', '36h', '90m', '3600s' as microseconds."""
    match = re.fullmatch(r"\s*([0-9]{1,12})\s*([dhms])\s*", text)
    if match is None:
        raise DdlError(f"duration {show(text)} must be a number of at most 12 digits followed "
                       "by d, h, m or s, e.g. '7d'")
    unit = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}[match[2]]
    return int(match[1]) * unit * 1_000_000
