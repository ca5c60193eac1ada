"""What a stream definition's input may hold, and how its problems are told: sizes checked
before validation expands them, and every value a message shows shortened, with passwords
hidden (a DSN's, a URL's)."""

from __future__ import annotations

import re
import reprlib
from typing import Any

import yaml
from pydantic import ValidationError

from cdcflow.errors import InvalidArgument

MAX_VALUES = 250_000
MAX_DEPTH = 64
_SECRETS = (
    (re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)"), r"\1***"),
    (re.compile(r"(?i)(\w+://[^@/\s]*?:)[^@]*@"), r"\1***@"),
)


def redact(text: str) -> str:
    """`text` with passwords (`password=...`, `scheme://user:...@`) replaced by ***."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class _Shown(reprlib.Repr):
    """Values as error messages show them: short, and no password of a DSN."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 80, 80
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 8

    def repr_str(self, x: str, level: int) -> str:
        import psycopg2.extensions

        try:
            if "password" in psycopg2.extensions.parse_dsn(x):
                return "'<a dsn with a password, not shown>'"
        except (psycopg2.Error, ValueError):
            pass
        return super().repr_str(redact(x), level)


_SHOWN = _Shown()


def check_size(data: Any) -> None:
    """A definition holds at most MAX_VALUES values nested MAX_DEPTH deep: a YAML alias bomb
    or a deep nest fails here, before validation would expand it into messages."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 0, ())]
    count = 1
    while stack:
        node, depth, where = stack.pop()
        children = _children(node)
        count += len(children)
        if count > MAX_VALUES:
            raise InvalidArgument(f"a stream definition holds at most {MAX_VALUES} values; "
                                  f"at {_place(where)} it holds more (YAML aliases expand)")
        if children and depth >= MAX_DEPTH:
            raise InvalidArgument(f"a stream definition nests at most {MAX_DEPTH} levels deep; "
                                  f"{_place(where)} nests deeper: {_SHOWN.repr(node)}")
        stack.extend((child, depth + 1, where if len(where) > _SHOWN_STEPS else (*where, step))
                     for step, child in children)


def _children(node: Any) -> list[tuple[Any, Any]]:
    """(key or index, value) of a mapping or a sequence; keys count as values too."""
    if isinstance(node, dict):
        return [*((key, key) for key in node), *node.items()]
    if isinstance(node, list | tuple | set | frozenset):
        return list(enumerate(node))
    return []


_SHOWN_STEPS = 6
"""How many keys of a too large or too deep value's place a message shows."""


def _place(where: tuple[Any, ...]) -> str:
    shown = ".".join(str(step)[:40] for step in where) or "the top"
    return shown + ("..." if len(where) > _SHOWN_STEPS else "")


def problems(error: ValidationError) -> str:
    """Each problem: where, the rule, and the value (shortened, passwords hidden)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {redact(e['msg'])} "
        f"(got {_SHOWN.repr(e.get('input'))})"
        for e in error.errors()
    )


def yaml_problem(error: yaml.YAMLError) -> str:
    """Where the YAML breaks and why, without the text around it (it may hold a password)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark, context = error.problem_mark, f"{error.context}: " if error.context else ""
        return redact(f"line {mark.line + 1}, column {mark.column + 1}: {context}"
                      f"{error.problem}")
    return redact(str(error))


def shown(value: Any) -> str:
    """`value` as a message shows it: short, with no password of a DSN."""
    return _SHOWN.repr(value)
