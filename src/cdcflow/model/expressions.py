"""The expressions of the embedded database's generated columns, in Spanner's dialect (seed
001, CW-3): `MOD(FARM_FINGERPRINT(CONCAT(FirstName, LastName)), 19)` and
`CASE WHEN Processed THEN NULL ELSE ... END`. Pure: `parse_expression` gives a tree whose
`evaluate(row)` computes the value from a row's columns.

- FARM_FINGERPRINT(STRING | BYTES): FarmHash Fingerprint64 (through `pyfarmhash`) as the
  signed INT64 Spanner returns; NULL gives NULL.
- MOD(X, Y): the remainder with the sign of X, as Spanner's MOD; Y = 0 is an error.
- CONCAT(a, ...): NULL if any argument is NULL.
- COALESCE(a, ...): the first argument that is not NULL.
- CASE WHEN c THEN x [WHEN ...] [ELSE y] END: c is a BOOL column or `e IS [NOT] NULL`, or
  NOT of one; a NULL condition is not true.
Literals: integers, 'strings', "strings", TRUE, FALSE, NULL. Column names are plain or
`quoted` (anything but a backtick).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcflow.errors import DdlError, InvalidArgument, show

_TOKEN = re.compile(
    r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|`(?P<quoted>[^`]+)`|(?P<number>-?[0-9]+)"
    r"|'(?P<squote>[^']*)'|\"(?P<dquote>[^\"]*)\"|(?P<sym>[(),]))")
_WORDS = {"CASE", "WHEN", "THEN", "ELSE", "END", "IS", "NOT", "NULL", "TRUE", "FALSE"}
MAX_DEPTH = 64
"""How deep expressions may nest (parentheses, NOT, CASE, calls)."""


def fingerprint(value: str | bytes) -> int:
    """FarmHash Fingerprint64 of a STRING (as UTF-8) or BYTES, as a signed 64-bit integer."""
    import farmhash

    unsigned = int(farmhash.fingerprint64(value))
    return unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned


def _mod(x: int, y: int) -> int:
    if type(x) is not int or type(y) is not int:
        raise InvalidArgument(f"MOD({show(x)}, {show(y)}): MOD takes INT64 values")
    if y == 0:
        raise InvalidArgument(f"MOD({x}, 0): division by zero")
    remainder = abs(x) % abs(y)
    return -remainder if x < 0 else remainder


def _concat(*values: Any) -> Any:
    if all(isinstance(v, str) for v in values) or all(isinstance(v, bytes) for v in values):
        return values[0][:0].join(values)
    raise InvalidArgument(f"CONCAT({', '.join(map(show, values))}): CONCAT takes STRING "
                          "values or BYTES values, not a mix nor other types")


def _farm(value: Any) -> int:
    if not isinstance(value, str | bytes):
        raise InvalidArgument(f"FARM_FINGERPRINT takes STRING or BYTES, not {value!r}")
    return fingerprint(value)


FUNCTIONS: dict[str, tuple[int, int | None, Callable[..., Any]]] = {
    "FARM_FINGERPRINT": (1, 1, _farm),
    "MOD": (2, 2, _mod),
    "CONCAT": (1, None, _concat),
}
"""name -> (fewest arguments, most arguments or None, function of non-NULL values)."""


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any

    def evaluate(self, row: dict[str, Any]) -> Any:
        return self.value

    def columns(self) -> set[str]:
        return set()


@dataclass(frozen=True, slots=True)
class ColumnRef:
    name: str

    def evaluate(self, row: dict[str, Any]) -> Any:
        return row.get(self.name)

    def columns(self) -> set[str]:
        return {self.name}


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Expression, ...]

    def evaluate(self, row: dict[str, Any]) -> Any:
        values = [arg.evaluate(row) for arg in self.args]
        if self.name == "COALESCE":
            return next((v for v in values if v is not None), None)
        if any(v is None for v in values):
            return None
        return FUNCTIONS[self.name][2](*values)

    def columns(self) -> set[str]:
        return set().union(*(arg.columns() for arg in self.args))


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Expression
    negated: bool

    def evaluate(self, row: dict[str, Any]) -> bool:
        return (self.operand.evaluate(row) is None) != self.negated

    def columns(self) -> set[str]:
        return self.operand.columns()


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expression

    def evaluate(self, row: dict[str, Any]) -> Any:
        value = self.operand.evaluate(row)
        return None if value is None else not value

    def columns(self) -> set[str]:
        return self.operand.columns()


@dataclass(frozen=True, slots=True)
class Case:
    branches: tuple[tuple[Expression, Expression], ...]
    otherwise: Expression

    def evaluate(self, row: dict[str, Any]) -> Any:
        for condition, result in self.branches:
            if condition.evaluate(row) is True:
                return result.evaluate(row)
        return self.otherwise.evaluate(row)

    def columns(self) -> set[str]:
        found = self.otherwise.columns()
        for condition, result in self.branches:
            found |= condition.columns() | result.columns()
        return found


Expression = Literal | ColumnRef | Call | IsNull | Not | Case


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(text.rstrip()):
            found = _TOKEN.match(text, position)
            if found is None or found.end() == position:
                raise DdlError(f"expression {text!r}: unexpected text at {text[position:]!r}")
            kind = found.lastgroup or "sym"
            self.tokens.append((kind, found.group(kind)))
            position = found.end()
        self.at = 0
        self.depth = 0

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _word(self, *words: str) -> bool:
        token = self._peek()
        if token is not None and token[0] == "ident" and token[1].upper() in words:
            self.at += 1
            return True
        return False

    def _sym(self, sym: str) -> bool:
        if self._peek() == ("sym", sym):
            self.at += 1
            return True
        return False

    def _expect(self, found: bool, what: str) -> None:
        if not found:
            token = self._peek()
            raise DdlError(f"expression {self.text!r}: expected {what}, found "
                           f"{token[1] if token else 'the end'!r}")

    def expression(self) -> Expression:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise DdlError(f"expression {show(self.text)} nests deeper than {MAX_DEPTH} levels")
        try:
            return self._expression()
        finally:
            self.depth -= 1

    def _expression(self) -> Expression:
        if self._word("NOT"):
            return Not(self.expression())
        operand = self._operand()
        if self._word("IS"):
            negated = self._word("NOT")
            self._expect(self._word("NULL"), "NULL after IS")
            return IsNull(operand, negated)
        return operand

    def _operand(self) -> Expression:
        token = self._peek()
        self._expect(token is not None, "a value")
        assert token is not None
        kind, text = token
        self.at += 1
        if kind == "number":
            return Literal(self._integer(text))
        if kind in ("squote", "dquote"):
            return Literal(text)
        if kind == "quoted":
            return ColumnRef(text)
        if kind == "sym":
            self._expect(text == "(", "a value")
            inner = self.expression()
            self._expect(self._sym(")"), "')'")
            return inner
        return self._word_operand(text)

    def _integer(self, text: str) -> int:
        if len(text.lstrip("-")) > 19 or not -(2**63) <= int(text) < 2**63:
            raise DdlError(f"expression {show(self.text)}: integer {show(text)} is outside "
                           "INT64, -2^63..2^63-1")
        return int(text)

    def _word_operand(self, text: str) -> Expression:
        word = text.upper()
        if word in ("NULL", "TRUE", "FALSE"):
            return Literal({"NULL": None, "TRUE": True, "FALSE": False}[word])
        if word == "CASE":
            return self._case()
        if self._sym("("):
            return self._call(word)
        if word in _WORDS:
            raise DdlError(f"expression {self.text!r}: unexpected {text!r}")
        return ColumnRef(text)

    def _call(self, name: str) -> Call:
        if name not in FUNCTIONS and name != "COALESCE":
            raise DdlError(f"expression {self.text!r}: unknown function {name}; known: "
                           f"{', '.join(sorted([*FUNCTIONS, 'COALESCE']))}")
        args = [self.expression()]
        while self._sym(","):
            args.append(self.expression())
        self._expect(self._sym(")"), "')' after the arguments")
        fewest, most, _ = FUNCTIONS.get(name, (1, None, None))
        if len(args) < fewest or (most is not None and len(args) > most):
            raise DdlError(f"expression {self.text!r}: {name} takes {fewest}"
                           f"{'' if most == fewest else '+' if most is None else f'-{most}'} "
                           f"arguments, not {len(args)}")
        return Call(name, tuple(args))

    def _case(self) -> Case:
        branches = []
        while self._word("WHEN"):
            condition = self.expression()
            self._expect(self._word("THEN"), "THEN")
            branches.append((condition, self.expression()))
        self._expect(bool(branches), "WHEN")
        otherwise = self.expression() if self._word("ELSE") else Literal(None)
        self._expect(self._word("END"), "END")
        return Case(tuple(branches), otherwise)


def parse_expression(text: str) -> Expression:
    """The expression of `text`; DdlError names the text and what was expected."""
    parser = _Parser(text)
    tree = parser.expression()
    parser._expect(parser._peek() is None, "the end of the expression")
    return tree
