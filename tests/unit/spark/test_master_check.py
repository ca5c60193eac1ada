"""A Spark master is checked before a JVM starts for it (issue 15: bad configuration gets a
clear error before the first batch): forms, and standalone masters that can't be reached."""

from __future__ import annotations

import socket

import pytest

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.spark.master import check_master, standalone_addresses

pytestmark = pytest.mark.unit


def closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("master", ["local", "local[1]", "local[*]", "local[4,2]"])
def test_local_masters_need_no_check(master: str):
    assert standalone_addresses(master) == []
    check_master(master)


def test_standalone_addresses_are_parsed():
    assert standalone_addresses("spark://a:7077,[::1]:7078") == [("a", 7077), ("::1", 7078)]


@pytest.mark.parametrize("master", [
    "yarn", "local[0]", "local[x]", "spark://", "spark://host", "spark://:7077",
    "spark://host:0", "spark://host:65536", "spark://host:port", "spark://a:1,b",
])
def test_a_bad_master_is_named_with_the_rule(master: str):
    with pytest.raises(InvalidArgument) as raised:
        check_master(master)
    assert repr(master) in str(raised.value)


def test_a_master_nobody_listens_on_fails_at_once_naming_it():
    port = closed_port()
    master = f"spark://127.0.0.1:{port}"
    with pytest.raises(FailedPrecondition) as raised:
        check_master(master, timeout=2.0)
    assert repr(master) in str(raised.value)
    assert f"127.0.0.1:{port}" in str(raised.value)


def test_one_listening_master_of_several_is_enough():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        check_master(f"spark://127.0.0.1:{closed_port()},127.0.0.1:{port}", timeout=2.0)
