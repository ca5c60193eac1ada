"""A real PostgreSQL server for the module's tests (started by the tests, on 127.0.0.1)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg2
import pytest

from cdcflow.localdb import LocalPostgres


@pytest.fixture(scope="module")
def pg() -> Iterator[LocalPostgres]:
    server = LocalPostgres.start()
    os.environ["CDCFLOW_TEST_PG_PASSWORD"] = server.password
    yield server
    server.stop()


@pytest.fixture
def pg_conn(pg: LocalPostgres) -> Iterator[object]:
    conn = psycopg2.connect(pg.dsn(), password=pg.password)
    conn.autocommit = True
    yield conn
    conn.close()
