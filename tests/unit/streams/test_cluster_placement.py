"""Where a stream's work goes on a standalone cluster (issue 15): a storage root is needed,
the destinations must lie under it, the runner's master comes from the definitions, and a
stream that names another cluster than the session's fails naming both. Each bad setting is a
typed error naming the value and the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.streams.cluster import (
    check_master_of,
    cluster_placement,
    destination_paths,
    master_of_streams,
)
from cdcflow.streams.definition import StreamDefinition

pytestmark = pytest.mark.unit
CLUSTER = "spark://10.0.0.5:7077"


def definition(root: Path, name: str = "lake", **spark: Any) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "source": {"database": "/data/shop.db", "change_stream": "S"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(root / "warehouse")},
                         {"kind": "event_files", "root": str(root / "events")}],
        "spark": spark})


def test_a_local_master_needs_no_placement(tmp_path: Path):
    assert cluster_placement(definition(tmp_path), "local[2]", tmp_path) is None


def test_a_cluster_places_segments_under_the_storage_root(tmp_path: Path):
    """One folder of segments per stream and catalog: two queries never share one."""
    lake = definition(tmp_path, storage_root=str(tmp_path))
    placement = cluster_placement(lake, CLUSTER, tmp_path / "catalog-a")
    other = cluster_placement(lake, CLUSTER, tmp_path / "catalog-b")
    assert placement is not None and other is not None
    assert placement.storage_root == str(tmp_path)
    assert Path(placement.segment_root).parent == tmp_path / "segments"
    assert Path(placement.segment_root).name.startswith("lake-")
    assert placement.segment_root != other.segment_root
    assert cluster_placement(lake, CLUSTER, tmp_path / "catalog-a") == placement
    assert destination_paths(definition(tmp_path)) == [
        str(tmp_path / "warehouse"), str(tmp_path / "events")]


def test_a_storage_root_behind_a_link_is_kept_as_written(tmp_path: Path):
    """Executors mount the root at the path the definition gives, not where a link on the
    driver's machine leads."""
    (tmp_path / "real").mkdir()
    (tmp_path / "mnt").symlink_to(tmp_path / "real")
    placement = cluster_placement(definition(tmp_path / "mnt", storage_root=str(
        tmp_path / "mnt")), CLUSTER, tmp_path)
    assert placement is not None and placement.storage_root == str(tmp_path / "mnt")


def test_a_cluster_without_a_storage_root_is_refused(tmp_path: Path):
    with pytest.raises(FailedPrecondition, match=r"stream 'lake' runs on Spark master "
                       r"'spark://10\.0\.0\.5:7077'.*set spark\.storage_root"):
        cluster_placement(definition(tmp_path), CLUSTER, tmp_path)


def test_destinations_outside_the_storage_root_are_named(tmp_path: Path):
    shared = tmp_path / "shared"
    with pytest.raises(FailedPrecondition, match=r"warehouse', '.*events'\] are not under "
                       r"spark\.storage_root"):
        cluster_placement(definition(tmp_path, storage_root=str(shared)), CLUSTER, tmp_path)


@pytest.mark.parametrize("root", ["shared", "./x", "s3://bucket/x"])
def test_a_storage_root_must_be_an_absolute_path(tmp_path: Path, root: str):
    with pytest.raises(InvalidArgument, match=f"storage_root {root!r} must be an absolute path"):
        definition(tmp_path, storage_root=root)


@pytest.mark.parametrize("rows", [-1, 10_000_001, "many"])
def test_driver_batch_rows_is_bounded(tmp_path: Path, rows: Any):
    with pytest.raises(InvalidArgument, match="driver_batch_rows"):
        definition(tmp_path, driver_batch_rows=rows)


def test_the_runner_master_is_the_cluster_the_definitions_name(tmp_path: Path):
    local = definition(tmp_path, "a", master="local[2]")
    on_cluster = definition(tmp_path, "b", master=CLUSTER)
    assert master_of_streams([]) == "local[*]"
    assert master_of_streams([local, definition(tmp_path, "d")]) == "local[*]"
    assert master_of_streams([on_cluster, definition(tmp_path, "e", master=CLUSTER)]) == CLUSTER
    other = definition(tmp_path, "c", master="spark://10.0.0.6:7077")
    with pytest.raises(InvalidArgument, match=r"name different Spark masters \(spark://10\.0"
                       r"\.0\.5:7077: b; spark://10\.0\.0\.6:7077: c\)"):
        master_of_streams([on_cluster, other])
    with pytest.raises(InvalidArgument, match=r"different Spark masters \(local: a; "
                       r"spark://10\.0\.0\.5:7077: b\)"):
        master_of_streams([local, on_cluster])  # a local stream can't run on a cluster


def test_a_stream_runs_on_the_cluster_it_names_unless_master_is_given(tmp_path: Path):
    on_cluster = definition(tmp_path, "b", master=CLUSTER)
    check_master_of(on_cluster, CLUSTER, master_given=False)
    check_master_of(on_cluster, "local[2]", master_given=True)
    check_master_of(definition(tmp_path, "a", master="local[*]"), "local[2]", False)
    with pytest.raises(FailedPrecondition, match=r"stream 'b' names Spark master "
                       r"'spark://10\.0\.0\.5:7077', but this runner's session is on "
                       r"'local\[2\]'"):
        check_master_of(on_cluster, "local[2]", master_given=False)
