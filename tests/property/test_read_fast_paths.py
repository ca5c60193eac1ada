"""The Spark source's rows of a log record (`_mod_rows`, read by every task) equal the plain
formula's: each JSON column encoded to text, one encoding per value (CS-5, EV-4)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.spark.reading import _batch, _mod_rows, _source_columns
from cdcflow.spark.schema import CHANGE_COLUMNS, arrow_of

pytestmark = pytest.mark.property

SCALARS = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=6) \
    | st.floats(allow_nan=False, allow_infinity=False)
VALUES = st.dictionaries(st.text(max_size=5), SCALARS, max_size=3)
MODS = st.fixed_dictionaries(
    {"keys": VALUES, "new_values": VALUES, "old_values": VALUES | st.just({})},
    optional={"position": st.dictionaries(st.sampled_from(["lsn", "log_file", "log_position"]),
                                          SCALARS, max_size=2)})
SOURCES = st.none() | st.fixed_dictionaries({
    "read_method": st.sampled_from(["postgresql-cdc-wal", "mysql-cdc-binlog"]),
    "source_timestamp": st.just("2026-11-27T03:00:00.123456Z"),
    "tx_id": st.text(max_size=6),
    "position": st.dictionaries(st.sampled_from(["lsn", "log_file"]), SCALARS, max_size=2)})


def _plain_rows(record: dict[str, Any], micros: int, token: str) -> list[tuple[Any, ...]]:
    """The rows as first written: every JSON column encoded to text on its own."""
    def text(value: Any) -> str:
        return orjson.dumps(value).decode()

    read_method, stamp, fields = _source_columns(record, micros)
    return [(micros, record["server_transaction_id"], record["record_sequence"], index,
             record["table_name"], record["mod_type"], record["value_capture_type"],
             record["number_of_records_in_transaction"],
             record["number_of_partitions_in_transaction"],
             record["is_last_record_in_transaction_in_partition"], token, text(mod["keys"]),
             text(mod["new_values"]), text(mod["old_values"]), text(record["column_types"]),
             read_method, stamp, text(fields | mod.get("position", {})))
            for index, mod in enumerate(record["mods"])]


@given(st.lists(MODS, min_size=1, max_size=4), SOURCES,
       st.sampled_from(["INSERT", "UPDATE", "DELETE"]), st.text(min_size=1, max_size=4),
       st.booleans())
@settings(max_examples=300, deadline=None)
def test_rows_of_a_record_equal_the_plain_formulas(mods: list[dict[str, Any]],
                                                  source: dict[str, Any] | None,
                                                  mod_type: str, key: str, apart: bool):
    """`apart`: the column types come as the text the log keeps them in (log format 4),
    as the writer's encoder wrote them, not in the record (column names with escapes
    included)."""
    record = {"server_transaction_id": "tx-1", "record_sequence": "00000002",
              "table_name": "T", "mod_type": mod_type, "value_capture_type": "NEW_ROW",
              "number_of_records_in_transaction": 3, "number_of_partitions_in_transaction": 2,
              "is_last_record_in_transaction_in_partition": False,
              "column_types": [{"name": key, "type": {"code": "INT64"},
                                "is_primary_key": True, "ordinal_position": 1}],
              "mods": mods}
    if source is not None:
        record["source"] = source
    schema = arrow_of(CHANGE_COLUMNS)
    rest, types = dict(record), None
    if apart:
        types = json.dumps(rest.pop("column_types"), separators=(",", ":"))
    fast = _batch(list(_mod_rows(rest, 1_795_000_000_000_000, "tok", types=types)), schema)
    plain = _batch(_plain_rows(record, 1_795_000_000_000_000, "tok"), schema)
    assert fast.equals(plain), (fast.to_pylist(), plain.to_pylist())
