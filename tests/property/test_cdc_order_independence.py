"""AP-4/AP-7 property: the applied table depends only on the set of changes: any arrival
order, any duplication, any split into apply jobs gives the same table, where per key the
greatest sequence wins and a newer DELETE's tombstone beats late older UPSERTs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.table import CdcTable

pytestmark = pytest.mark.property

change = st.tuples(
    st.integers(min_value=0, max_value=12),  # key
    st.booleans(),  # delete?
    st.integers(min_value=-5, max_value=5),  # value
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    changes=st.lists(change, min_size=2, max_size=30),
    data=st.data(),
)
def test_same_set_of_changes_gives_same_table(changes, data):
    numbered = [
        {"id": key, "v": None if delete else value,
         "_CHANGE_TYPE": "DELETE" if delete else "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": f"{seq // 7:X}/{seq:x}"}
        for seq, (key, delete, value) in enumerate(changes)
    ]
    expected: dict[int, int | None] = {}
    for row in numbered:  # in sequence order: the last one per key wins
        if row["_CHANGE_TYPE"] == "DELETE":
            expected.pop(row["id"], None)
        else:
            expected[row["id"]] = row["v"]
    arrival = data.draw(st.permutations(numbered))
    duplicates = data.draw(st.lists(st.sampled_from(numbered), max_size=10))
    arrival = arrival + duplicates
    cuts = sorted(data.draw(st.lists(st.integers(0, len(arrival)), max_size=4)))
    with tempfile.TemporaryDirectory() as folder:
        table = CdcTable.create(Path(folder) / "t", "id INT64 NOT NULL, v INT64", ["id"],
                                target_file_rows=2)
        start = 0
        for cut in [*cuts, len(arrival)]:
            if cut > start:
                table.connection().append(arrival[start:cut])
                if data.draw(st.booleans()):
                    table.apply()
            start = max(start, cut)
        merged = {r["id"]: r["v"] for r in table.to_arrow().to_pylist()}
        table.apply()
        applied = {r["id"]: r["v"] for r in table.to_arrow().to_pylist()}
    assert merged == expected
    assert applied == expected
