"""The driver's reading of Spark's offset log (issue 11): any file it cannot take for a
cdcflow offset makes it hand the batch back to Spark, never guess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.model.timestamps import from_micros
from cdcflow.spark.driver_batch import DriverReader, logged_batch_time, logged_offset
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


def test_the_batch_time_spark_logged_is_read_back(tmp_path: Path):
    """The read time of every attempt at a batch: `batchTimestampMs` of its entry."""
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1_764_000_000_123,
                "conf": {"spark.sql.shuffle.partitions": "2"}}
    write_offset_log(tmp_path, 4, ["v1", json.dumps(metadata), json.dumps(OFFSET.to_dict())])
    assert logged_batch_time(tmp_path, 4) == from_micros(1_764_000_000_123_000)
    options = parse_options({"database": str(tmp_path / "x.db"), "stream": "s"})
    assert DriverReader(str(tmp_path), options, limit=0).read_time(4) == \
        from_micros(1_764_000_000_123_000)


@pytest.mark.parametrize("metadata", [
    "{}", "not json", "[]", json.dumps({"batchTimestampMs": "1764000000123"}),
    json.dumps({"batchTimestampMs": 0}), json.dumps({"batchTimestampMs": True}),
    json.dumps({"batchTimestampMs": 1.5e12}),
])
def test_a_batch_time_it_cannot_take_gives_none(tmp_path: Path, metadata: str):
    write_offset_log(tmp_path, 0, ["v1", metadata, json.dumps(OFFSET.to_dict())])
    assert logged_batch_time(tmp_path, 0) is None
    assert logged_batch_time(tmp_path, 1) is None  # no entry at all


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
