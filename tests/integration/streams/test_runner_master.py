"""`cdcflow run` with a standalone master that can't be reached fails at once, naming it,
before any JVM starts (issue 15), instead of Spark's minute of retries and a stack trace;
so does a run of a second catalog in one folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cdcflow.streams.catalog import Catalog
from cdcflow.streams.home import claim_home
from tests.integration.streams.test_runner_interrupt import MARK, marked

pytestmark = pytest.mark.integration


def test_run_with_an_unreachable_master_fails_naming_it(tmp_path: Path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = f"spark://127.0.0.1:{port}"
    mark = uuid.uuid4().hex
    done = subprocess.run(
        [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
         str(tmp_path / "catalog.db"), "--master", master],
        env={**os.environ, MARK: mark}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"Spark master {master!r} can't be reached" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not marked(mark), "a process of the run outlived it"
    assert not (tmp_path / "logs" / "spark.log").exists(), "a JVM was started"


def test_run_of_a_second_catalog_in_one_folder_fails_naming_both(tmp_path: Path):
    """One catalog per folder (`cdcflow.streams.home`): refused before any JVM starts."""
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    claim_home(tmp_path, Catalog(first))
    done = subprocess.run(
        [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog", str(second)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert str(first.resolve()) in done.stderr and str(second.resolve()) in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "logs").exists(), "a JVM was started"
    assert not second.exists(), "the refused catalog was made"
