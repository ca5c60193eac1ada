"""A real MariaDB server for the module's tests (started by the tests, on 127.0.0.1)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cdcflow.localmaria import LocalMariaDB


@pytest.fixture(scope="module")
def maria() -> Iterator[LocalMariaDB]:
    server = LocalMariaDB.start()
    os.environ["CDCFLOW_TEST_MYSQL_PASSWORD"] = server.password
    yield server
    server.stop()
