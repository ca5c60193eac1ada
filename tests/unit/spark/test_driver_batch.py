"""The driver's reading of Spark's offset log (issue 11): any file it cannot take for a
cdcflow offset makes it hand the batch back to Spark, never guess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.spark.driver_batch import DriverReader, logged_offset
from cdcflow.spark.offsets import StreamOffset
from cdcflow.spark.options import parse_options

pytestmark = pytest.mark.unit
OFFSET = StreamOffset(1_700_000_000_000_000, ("p1", "p2"))


def write_offset_log(checkpoint: Path, batch_id: int, lines: list[str]) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(lines))


def test_an_offset_spark_logged_is_read_back(tmp_path: Path):
    write_offset_log(tmp_path, 3, ["v1", json.dumps({"batchWatermarkMs": 0}),
                                   json.dumps(OFFSET.to_dict())])
    assert logged_offset(tmp_path, 3) == OFFSET


@pytest.mark.parametrize("lines", [
    ["v2", "{}", json.dumps(OFFSET.to_dict())],                      # another log format
    ["v1", "{}"],                                                    # no source offset
    ["v1", "{}", json.dumps(OFFSET.to_dict()), "{}"],                # two sources
    ["v1", "{}", "not json"],
    ["v1", "{}", json.dumps({"version": 999, "timestamp": 1, "partitions": {}})],
    ["v1", "{}", json.dumps({"version": OFFSET.to_dict()["version"]})],  # no partitions
])
def test_an_offset_log_it_cannot_take_gives_none(tmp_path: Path, lines: list[str]):
    write_offset_log(tmp_path, 0, lines)
    assert logged_offset(tmp_path, 0) is None


def test_a_missing_offset_gives_none(tmp_path: Path):
    assert logged_offset(tmp_path, 7) is None


def test_the_first_batch_and_a_batch_without_offsets_go_to_spark(tmp_path: Path):
    options = parse_options({"database": str(tmp_path / "x.db"), "stream": "s",
                             "startingTimestamp": "earliest"})
    reader = DriverReader(str(tmp_path), options, limit=100)
    write_offset_log(tmp_path, 0, ["v1", "{}", json.dumps(OFFSET.to_dict())])
    assert reader.read(0) is None        # batch 0 has no offset before it
    assert reader.read(2) is None        # offsets/1 and offsets/2 are missing
    write_offset_log(tmp_path, 1, ["v1", "{}", json.dumps(OFFSET.to_dict())])
    assert reader.read(1) == []          # same offset at both ends: an empty batch
