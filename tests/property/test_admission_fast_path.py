"""Admission control reads only up to a bound (`log.admission_counts`) and must end every
batch where counting `max_rows + 1` records of every partition ends it (CS-5: a batch keeps
transactions whole; its size is about maxRecordsPerTrigger)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow import Database, PartitionPolicy
from cdcflow.spark.offsets import admit
from cdcflow.store import log

pytestmark = pytest.mark.property


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=3), min_size=1,
                max_size=40),
       st.integers(1, 20), st.integers(0, 40), st.integers(0, 40), st.integers(1, 3))
def test_batches_end_where_counting_every_partition_ends_them(transactions, max_rows,
                                                              first, last, partitions):
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "shop.db")
        database = Database.open(path, partition_policy=PartitionPolicy(auto=False),
                                 initial_partitions=partitions)
        database.ddl("CREATE TABLE K (Id INT64 NOT NULL) PRIMARY KEY (Id)")
        database.ddl("CREATE CHANGE STREAM S FOR ALL")
        stamps = [0]
        for keys in transactions:
            with database.transaction() as tx:
                for key in set(keys):
                    tx.replace("K", {"Id": key})
            stamps.append(int(tx.commit_timestamp.timestamp() * 1_000_000))
        after = stamps[min(first, len(stamps) - 1)]
        until = max(after, stamps[min(last, len(stamps) - 1)])
        tokens = [p.token for p in database.partitions("S")]
        conn = sqlite3.connect(path)
        every = [count for token in tokens
                 for count in log.mod_counts(conn, "S", token, after, until, max_rows + 1)]
        bound, counts = log.admission_counts(conn, "S", tokens, after, until, max_rows)
        conn.close()
        database.close()
        assert after <= bound <= until
        assert bound == until or sum(n for micros, n in counts if micros <= bound) > max_rows
        assert admit(counts, after, bound, max_rows) == admit(every, after, until, max_rows)
