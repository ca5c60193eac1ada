from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcflow import Database, FakeClock

ACCOUNT_BALANCE = (
    "CREATE TABLE AccountBalance (AccountId STRING(MAX) NOT NULL, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp = true), Balance INT64) "
    "PRIMARY KEY (AccountId)"
)


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "shop.db")


@pytest.fixture
def db(db_path: str) -> Iterator[Database]:
    database = Database.open(db_path)
    yield database
    database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_db(db_path: str, clock: FakeClock) -> Iterator[Database]:
    database = Database.open(db_path, clock=clock)
    yield database
    database.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession for the whole test process (a session costs ~5 s to start)."""
    from cdcflow.spark import session

    spark = session("cdcflow-tests", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()
