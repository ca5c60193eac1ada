"""The pending table's Delta log stays short (issue 11): it takes a commit per micro-batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.table import CdcTable
from cdcflow.table.pending import (
    PENDING_LOG_PROPERTIES,
    PendingLogs,
    commit_pending_files,
    pending_path,
)

pytestmark = pytest.mark.unit


def properties(root: Path) -> dict[str, str]:
    return DeltaTable(pending_path(root)).metadata().configuration


def test_a_new_pending_table_cleans_its_log(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL", ["id"])
    assert properties(table.root).items() >= PENDING_LOG_PROPERTIES.items()


def test_a_pending_table_made_before_gets_the_cleanup_when_a_query_opens_it(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL", ["id"])
    DeltaTable(pending_path(table.root)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 30 days",
         "delta.enableExpiredLogCleanup": "false"})
    logs = PendingLogs()
    logs.fresh(table.root)
    assert properties(table.root).items() >= PENDING_LOG_PROPERTIES.items()
    assert commit_pending_files(str(table.root), [], "app", 1, SYSTEM_CLOCK, logs)
    assert not commit_pending_files(str(table.root), [], "app", 1, SYSTEM_CLOCK, logs)


def test_a_query_whose_table_was_loaded_anew_elsewhere_still_sees_new_commits(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL", ["id"])
    logs = PendingLogs()
    before = logs.fresh(table.root).version()
    commit_pending_files(str(table.root), [], "other", 7, SYSTEM_CLOCK)  # another writer
    assert logs.fresh(table.root).version() == before + 1
    assert logs.fresh(table.root).transaction_version("other") == 7


def test_pending_files_are_read_once_and_the_cache_keeps_to_its_rows(tmp_path: Path):
    """Issue 11: the fold's lookups read every unapplied pending file on every batch; a
    pending file never changes, so each is read once, within a bound of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdcflow.table.apply import PendingFileCache

    target = pa.schema([pa.field("id", pa.int64())])
    paths = []
    for number, rows in enumerate([3, 4, 5]):
        paths.append(str(tmp_path / f"part-{number}.parquet"))
        pq.write_table(pa.table({"id": list(range(rows))}, schema=target), paths[-1])
    cache = PendingFileCache(max_rows=9)
    first = cache.rows(paths[0], target)
    assert cache.rows(paths[0], target) is first            # read once
    cache.rows(paths[1], target)
    cache.rows(paths[2], target)                             # 12 rows > 9: the oldest goes
    assert cache.rows(paths[0], target) is not first
    assert cache.rows(paths[0], target).to_pydict() == {"id": [0, 1, 2]}
    wider = pa.schema([pa.field("id", pa.int64()), pa.field("note", pa.string())])
    assert cache.rows(paths[0], wider).column_names == ["id", "note"]  # per target schema


def test_a_querys_batches_commit_at_the_first_attempt(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    """Delta refuses a commit whose app transaction it finds in a commit newer than the
    table it was made on, the query's own last batch included: the loaded table moves past
    each commit, so batch after batch commits without a refused attempt."""
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL", ["id"])
    logs = PendingLogs()
    logs.fresh(table.root)
    attempts = []
    commit = DeltaTable.create_write_transaction

    def counted(self: DeltaTable, *args: object, **kwargs: object) -> None:
        attempts.append(self.version())
        commit(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", counted)
    for batch in range(1, 6):
        assert commit_pending_files(str(table.root), [], "app", batch, SYSTEM_CLOCK, logs)
    assert len(attempts) == 5, attempts
    assert logs.fresh(table.root, refresh=False).transaction_version("app") == 5
