"""Merge-on-read CDC tables (issue 11, goal 5): deletion vectors plus a patch per range must
give exactly the rows a rewrite gives (AP-4 order, AP-7 tombstones), to cdcflow's own reads
and to a third-party Delta reader (delta-rs's DataFusion engine)."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from cdcflow import FakeClock
from cdcflow.errors import DataLoss, InvalidArgument
from cdcflow.table import CdcTable
from cdcflow.table.deletion_vectors import (
    DeletionVector,
    read_vector,
    write_vector,
    z85_decode,
    z85_encode,
)
from cdcflow.table.layout import read_manifest

pytestmark = pytest.mark.unit
SCHEMA = "id INT64 NOT NULL, name STRING(MAX), salary INT64"
BASE_ROWS = 40_000


def test_descriptor_paths_follow_the_delta_protocol_example(tmp_path: Path):
    """The protocol's own example: prefix "ab", UUID d2c639aa-8816-431a-aaf6-d3fe2512ff61."""
    descriptor = DeletionVector("ab^-aqEH.-t@S}K{vb[*k^", 1, 10, 1)
    assert descriptor.file(tmp_path) == (
        tmp_path / "ab" / "deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin")
    identity = uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes
    assert z85_encode(identity) == "^-aqEH.-t@S}K{vb[*k^"
    assert z85_decode("^-aqEH.-t@S}K{vb[*k^") == identity


def test_a_damaged_vector_is_data_loss(tmp_path: Path):
    descriptor = write_vector(tmp_path, BitMap64([3, 9, 2**33]))
    assert sorted(read_vector(tmp_path, descriptor)) == [3, 9, 2**33]
    path = descriptor.file(tmp_path)
    body = bytearray(path.read_bytes())
    body[-6] ^= 0xFF
    path.write_bytes(bytes(body))
    with pytest.raises(DataLoss, match="checksum"):
        read_vector(tmp_path, descriptor)


def test_the_option_is_validated_and_read_back(tmp_path: Path):
    with pytest.raises(InvalidArgument, match="deletion_vectors 'yes' must be True or False"):
        CdcTable.create(tmp_path / "bad", SCHEMA, ["id"], deletion_vectors="yes")  # type: ignore[arg-type]
    assert not (tmp_path / "bad" / "_cdcflow" / "table.json").exists()
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    assert table.options["deletion_vectors"] is False
    table.alter(deletion_vectors=True)
    assert CdcTable.open(tmp_path / "t").options["deletion_vectors"] is True


def _changes(rng: random.Random, count: int, high_key: int, sequences: list[int]) -> pa.Table:
    ids, kinds, names, seqs = [], [], [], []
    for n in range(count):
        ids.append(rng.randrange(high_key))
        kinds.append("DELETE" if rng.random() < 0.2 else "UPSERT")
        names.append(f"n{rng.randrange(10**6)}")
        seqs.append(f"{rng.choice(sequences) * 1000 + n:x}")
    return pa.table({"id": pa.array(ids, pa.int64()), "name": names,
                     "salary": pa.array(range(count), pa.int64()), "_CHANGE_TYPE": kinds,
                     "_CHANGE_SEQUENCE_NUMBER": seqs})


def _tables(tmp_path: Path, **options: Any) -> tuple[CdcTable, CdcTable]:
    base = pa.table({"id": pa.array(range(0, 2 * BASE_ROWS, 2), pa.int64()),
                     "name": [f"b{i}" for i in range(BASE_ROWS)],
                     "salary": pa.array(range(BASE_ROWS), pa.int64())})
    made = []
    for name, vectors in (("plain", False), ("mor", True)):
        table = CdcTable.create(tmp_path / name, SCHEMA, ["id"], target_file_rows=10_000,
                                deletion_vectors=vectors, **options)
        table.bulk_load(base)
        made.append(table)
    return made[0], made[1]


def _sorted(table: pa.Table) -> list[tuple]:
    return sorted((r["id"], r["name"], r["salary"]) for r in table.to_pylist())


def _third_party_rows(root: Path) -> list[tuple]:
    result = QueryBuilder().register("t", DeltaTable(str(root))).execute(
        "SELECT id, name, salary FROM t")
    return _sorted(pa.table(result.read_all()))


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), rounds=st.integers(3, 6))
def test_merge_on_read_equals_rewrites_for_every_reader(tmp_path_factory, seed: int, rounds: int):
    """Random keys, deletes and sequence numbers that arrive out of order across rounds
    (late changes older than what a base or a patch holds): after every apply the
    merge-on-read table, read by cdcflow and by DataFusion, equals the rewritten one; and
    a runtime merge over unapplied changes does too. Enough rounds compact some ranges."""
    plain, mor = _tables(tmp_path_factory.mktemp("mor"))
    rng = random.Random(seed)
    for round_ in range(rounds):
        changes = _changes(rng, rng.randrange(200, 1500), 2 * BASE_ROWS + 500,
                           [round_, round_, max(0, round_ - 2)])
        for table in (plain, mor):
            table.connection().append(changes)
        assert _sorted(mor.to_arrow()) == _sorted(plain.to_arrow())  # runtime merge
        sample = [(rng.randrange(2 * BASE_ROWS),) for _ in range(50)]
        assert mor.lookup(sample) == plain.lookup(sample)
        plain.apply()
        stats = mor.apply()
        expected = _sorted(plain.to_arrow())
        assert _sorted(mor.to_arrow()) == expected
        assert _third_party_rows(mor.root) == expected
        if round_ == 0:
            assert stats["files_patched"] > 0 and stats["files_rewritten"] == 0
    manifest = read_manifest(DeltaTable(str(mor.root)))
    assert any(f.vector is not None for f in manifest.files)
    assert sum(f.live_rows for f in manifest.files) == len(_sorted(plain.to_arrow()))


def test_a_range_is_compacted_once_its_patch_grows(tmp_path: Path):
    """COMPACT_FRACTION: past a quarter of the base, the range is rewritten and its
    vector and patch go away; the rows stay the same."""
    plain, mor = _tables(tmp_path)
    changes = pa.table({"id": pa.array(range(0, 6000, 2), pa.int64()),
                        "name": ["x"] * 3000, "salary": pa.array(range(3000), pa.int64()),
                        "_CHANGE_TYPE": ["UPSERT"] * 3000})
    for table in (plain, mor):
        table.connection().append(changes.slice(0, 2000))
    assert mor.apply()["files_patched"] == 1
    assert read_manifest(DeltaTable(str(mor.root))).files[0].patch is not None
    for table in (plain, mor):
        table.connection().append(changes.slice(2000))
    stats = mor.apply()
    plain.apply()
    assert (stats["files_rewritten"], stats["files_patched"]) == (1, 0)
    first = read_manifest(DeltaTable(str(mor.root))).files[0]
    assert first.vector is None and first.patch is None
    assert _sorted(mor.to_arrow()) == _sorted(plain.to_arrow())
    assert _third_party_rows(mor.root) == _sorted(plain.to_arrow())


def _upserts(ids: list[int], sequence: str, kind: str = "UPSERT") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"s{sequence}"] * len(ids),
                     "salary": pa.array(ids, pa.int64()), "_CHANGE_TYPE": [kind] * len(ids),
                     "_CHANGE_SEQUENCE_NUMBER": [sequence] * len(ids)})


def test_late_changes_lose_to_a_compacted_base_until_its_tombstones_expire(tmp_path: Path):
    """AP-4 and AP-7 through a patch: once a compaction has written real orders into a
    base, a late change older than the base's order for its key is dropped, a late UPSERT
    older than a base tombstone too, until the tombstone's retention ends."""
    clock = FakeClock()
    plain, mor = _tables(tmp_path, clock=clock, delete_retention=timedelta(hours=1))
    for table in (plain, mor):
        table.connection().append(_upserts(list(range(0, 6000, 2)), "100"))
        table.connection().append(_upserts([2, 8], "200", "DELETE"))
        table.apply()  # 3,000 changes in one range of 10,000: a compaction
    first = read_manifest(DeltaTable(str(mor.root))).files[0]
    assert first.patch is None and first.max_order is not None
    late = pa.concat_tables([_upserts([4], "50"), _upserts([2], "150"), _upserts([6], "300")])
    for table in (plain, mor):
        table.connection().append(late)
        stats = table.apply()
    assert stats["files_patched"] == 1
    expected = _sorted(plain.to_arrow())
    assert _sorted(mor.to_arrow()) == expected == _third_party_rows(mor.root)
    rows = {r[0]: r for r in expected}
    assert rows[4][1] == "s100" and 2 not in rows and rows[6][1] == "s300"
    clock.advance(timedelta(hours=2))
    for table in (plain, mor):
        table.connection().append(_upserts([8], "10"))
        stats = table.apply()
    assert stats["files_patched"] == 1
    assert _sorted(mor.to_arrow()) == _sorted(plain.to_arrow())
    assert {r[0]: r for r in _sorted(mor.to_arrow())}[8][1] == "s10"


def test_hand_written_commits_are_checkpointed(tmp_path: Path, monkeypatch):
    """cdcflow writes the commits that carry vectors itself, so it checkpoints them as
    delta-rs does its own; a checkpoint keeps the vectors (readers still agree)."""
    import cdcflow.table.apply as apply_module

    monkeypatch.setattr(apply_module, "CHECKPOINT_INTERVAL", 3)
    plain, mor = _tables(tmp_path)
    for round_ in range(4):
        for table in (plain, mor):
            table.connection().append(_upserts([round_ * 7, 1000 + round_ * 2], f"{round_ + 1}"))
            table.apply()
    assert list((mor.root / "_delta_log").glob("*.checkpoint.parquet"))
    for name in (mor.root / "_delta_log").glob("0000000000000000000[0-2].json"):
        name.unlink()  # readers must now start from the checkpoint
    assert _third_party_rows(mor.root) == _sorted(plain.to_arrow()) == _sorted(mor.to_arrow())


@settings(max_examples=200, deadline=None)
@given(base=st.sets(st.integers(-2**63, 2**63 - 1), max_size=60),
       wanted=st.lists(st.integers(-2**63, 2**63 - 1), max_size=30),
       reuse=st.lists(st.integers(0, 59), max_size=20))
def test_binary_searched_positions_equal_the_hash_set_path(base, wanted, reuse):
    """base_positions' fast path for one integer key (searchsorted over the sorted base)
    finds exactly what a hash-set membership test finds, string keys take the latter."""
    import numpy as np
    import pyarrow.compute as pc

    from cdcflow.table.patching import base_positions

    keys = sorted(base)
    wanted = wanted + [keys[i % len(keys)] for i in reuse] if keys else wanted
    base_array, wanted_array = pa.array(keys, pa.int64()), pa.array(wanted, pa.int64())
    plain = np.asarray(pc.indices_nonzero(pc.is_in(base_array, value_set=wanted_array)))
    assert list(base_positions(base_array, wanted_array)) == list(plain)
    as_text = base_positions(pa.array([f"{k:+021d}" for k in keys], pa.string()),
                             pa.array([f"{k:+021d}" for k in wanted], pa.string()))
    assert list(as_text) == list(plain)
