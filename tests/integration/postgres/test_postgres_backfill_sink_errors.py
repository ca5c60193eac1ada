"""A PostgreSQL backfill passes its sink's own errors on as they are: a destination's (a full
disk, say) keeps its type, and so does a stream deleted meanwhile (StreamGone), whose start
then releases the snapshot. Only the server's errors become "reading the snapshot"."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import StreamGone
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source

pytestmark = pytest.mark.integration


def _raising(error: BaseException) -> Any:
    def sink(*_: Any) -> None:
        raise error
    return sink


def test_a_sink_s_errors_come_out_of_the_backfill_as_they_are(pg: LocalPostgres, pg_conn: Any,
                                                               tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE sunk (id int PRIMARY KEY); INSERT INTO sunk VALUES (1)")
    definition = StreamDefinition.parse({
        "name": "sunk", "include": ["public.sunk"],
        "source": {"kind": "postgres", "dsn": pg.dsn(),
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "e")}]})
    source = open_source(definition, tmp_path)
    (item,) = [o for o in source.discover() if o.name == "public.sunk"]
    snapshot = source.snapshot([item], None)
    try:
        with pytest.raises(StreamGone, match="gone"):
            source.backfill(snapshot, [item], _raising(StreamGone("gone")), None)
        full = OSError(errno.ENOSPC, "No space left on device")
        with pytest.raises(OSError) as raised:
            source.backfill(snapshot, [item], _raising(full), None)
        assert raised.value is full
    finally:
        source.release(snapshot)
