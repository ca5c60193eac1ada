"""Parse `SELECT ChangeRecord FROM READ_<stream>(name => value, ...)` (CS-5).

Arguments are named (`start_timestamp => @start`) or positional in the order start_timestamp,
end_timestamp, partition_token, heartbeat_milliseconds. Values are `@param` references, NULL,
integers, or quoted strings. Missing required arguments and unknown names are errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cdcflow.errors import InvalidArgument, show
from cdcflow.model.timestamps import as_datetime
from cdcflow.model.types import check_text

ARGUMENTS = ("start_timestamp", "end_timestamp", "partition_token", "heartbeat_milliseconds")
_QUERY = re.compile(
    r"\s*SELECT\s+ChangeRecord\s+FROM\s+READ_(?P<stream>[A-Za-z_][A-Za-z0-9_]*)\s*"
    r"\((?P<args>.*)\)\s*;?\s*",
    re.IGNORECASE | re.DOTALL,
)
_ARG = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_]+)\s*=>\s*)?(?P<value>@[A-Za-z_][A-Za-z0-9_]*|NULL|-?[0-9]+"
    r"|'[^']*'|\"[^\"]*\")\s*",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ChangeStreamQuery:
    stream: str
    start_timestamp: datetime
    end_timestamp: datetime | None
    partition_token: str | None
    heartbeat_milliseconds: int


def _split_args(text: str) -> list[str]:
    parts, current, quote = [], "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ",":
            parts.append(current)
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current)
    return parts


def _value(raw: str, params: dict[str, Any], name: str) -> Any:
    if raw.startswith("@"):
        if raw[1:] not in params:
            raise InvalidArgument(f"argument {name} refers to parameter {raw} but no such param")
        return params[raw[1:]]
    if raw.upper() == "NULL":
        return None
    if raw[0] in "'\"":
        return raw[1:-1]
    if len(raw.lstrip("-")) > 19:
        raise InvalidArgument(f"argument {name} {show(raw)} is outside INT64, -2^63..2^63-1")
    return int(raw)


def parse_change_stream_query(sql: str, params: dict[str, Any]) -> ChangeStreamQuery:
    match = _QUERY.fullmatch(check_text(sql, "query"))
    if match is None:
        raise InvalidArgument(
            f"query {sql!r} is not a change stream query; write SELECT ChangeRecord FROM "
            "READ_<stream>(start_timestamp => ..., end_timestamp => ..., partition_token => "
            "..., heartbeat_milliseconds => ...)"
        )
    values: dict[str, Any] = {}
    for position, part in enumerate(_split_args(match["args"])):
        arg = _ARG.fullmatch(part)
        if arg is None:
            raise InvalidArgument(f"cannot parse argument {part.strip()!r} in {sql!r}")
        name = (arg["name"] or (ARGUMENTS[position] if position < len(ARGUMENTS) else "")).lower()
        if name not in ARGUMENTS:
            raise InvalidArgument(
                f"unknown argument {arg['name'] or part.strip()!r} of READ_{match['stream']}; "
                f"the arguments are {', '.join(ARGUMENTS)}"
            )
        if name in values:
            raise InvalidArgument(f"argument {name} is given twice in {sql!r}")
        values[name] = _value(arg["value"], params, name)
    for required in ("start_timestamp", "heartbeat_milliseconds"):
        if values.get(required) is None:
            raise InvalidArgument(f"argument {required} is required and may not be NULL (CS-5)")
    heartbeat = values["heartbeat_milliseconds"]
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int):
        raise InvalidArgument(f"heartbeat_milliseconds {show(heartbeat)} must be an INT64")
    token = values.get("partition_token")
    if token is not None and not isinstance(token, str):
        raise InvalidArgument(f"partition_token {show(token)} must be a STRING")
    end = values.get("end_timestamp")
    return ChangeStreamQuery(
        stream=match["stream"],
        start_timestamp=as_datetime(values["start_timestamp"]),
        end_timestamp=None if end is None else as_datetime(end),
        partition_token=token,
        heartbeat_milliseconds=heartbeat,
    )
