"""A Spark master is checked before a JVM starts for it (issue 15: bad configuration gets a
clear error before the first batch): forms, standalone masters that can't be reached, and
masters whose REST server says they run another Spark version."""

from __future__ import annotations

import http.server
import socket
import threading
from importlib.metadata import version

import pytest

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.spark.master import REST_PORT_VARIABLE, check_master, standalone_addresses
from cdcflow.spark.session import on_loopback

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


class _Readyz(http.server.BaseHTTPRequestHandler):
    answer = b""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/v1/submissions/readyz" else 404)
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def rest_answering(monkeypatch: pytest.MonkeyPatch):
    """A listening master port and a REST port answering readyz with the given body."""
    servers = []

    def start(body: bytes) -> str:
        handler = type("Handler", (_Readyz,), {"answer": body})
        rest = http.server.HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=rest.serve_forever, daemon=True).start()
        master = socket.socket()
        master.bind(("127.0.0.1", 0))
        master.listen()
        servers.append((rest, master))
        monkeypatch.setenv(REST_PORT_VARIABLE, str(rest.server_address[1]))
        return f"spark://127.0.0.1:{master.getsockname()[1]}"

    yield start
    for rest, master in servers:
        rest.shutdown()
        master.close()


def test_a_master_of_another_spark_version_is_named(rest_answering):
    master = rest_answering(b'{"action": "ReadyzResponse", "serverSparkVersion": "3.5.1"}')
    with pytest.raises(FailedPrecondition, match=rf"Spark master '{master}' runs Spark 3\.5\.1, "
                       rf"but this client's pyspark is {version('pyspark')}"):
        check_master(master)


def test_a_master_of_the_same_minor_version_passes(rest_answering):
    major_minor = ".".join(version("pyspark").split(".")[:2])
    check_master(rest_answering(f'{{"serverSparkVersion": "{major_minor}.99"}}'.encode()))


def test_a_rest_server_that_does_not_say_gives_no_verdict(rest_answering):
    check_master(rest_answering(b"<html>not json</html>"))


def test_a_bad_rest_port_setting_is_named(rest_answering, monkeypatch: pytest.MonkeyPatch):
    master = rest_answering(b"{}")
    monkeypatch.setenv(REST_PORT_VARIABLE, "http")
    with pytest.raises(InvalidArgument, match=r"CDCFLOW_SPARK_REST_PORT='http' is not a port"):
        check_master(master)


@pytest.mark.parametrize(("master", "loopback"), [
    ("local[2]", True), ("spark://127.0.0.1:7077", True), ("spark://localhost:1,[::1]:2", True),
    ("spark://10.0.0.5:7077", False), ("spark://127.0.0.1:1,10.0.0.5:2", False), (None, False)])
def test_the_driver_binds_to_loopback_only_for_a_master_on_it(master: str | None,
                                                                 loopback: bool):
    """Executors on other machines must reach the driver (issue 15)."""
    assert on_loopback(master) is loopback


def test_a_rest_answer_that_is_not_an_object_gives_no_verdict(rest_answering):
    check_master(rest_answering(b'["3.5.1"]'))
