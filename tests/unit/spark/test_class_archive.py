"""The driver JVM's class archive (issue 14: a killed runner starts again sooner): where it
lives, when a session uses it, and how its options combine with the caller's."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from cdcflow.cli.prepare import _train, prepare
from cdcflow.spark.class_archive import (
    DRIVER_OPTIONS_VARIABLE,
    EXTRA_OPTIONS,
    archive_path,
    driver_java_options,
)
from cdcflow.spark.session import _settings

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(DRIVER_OPTIONS_VARIABLE, raising=False)
    return tmp_path / "cdcflow"


def _made(mode: int = 0o444) -> Path:
    """An archive where `cdcflow prepare` puts it (its content is the JVM's to check)."""
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"archive")
    path.chmod(mode)
    return path


def test_the_archive_comes_first_then_the_variable_then_the_sessions_own(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    path = _made()
    assert path.parent == cache
    monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, " -Xmx1g ")
    assert driver_java_options({EXTRA_OPTIONS: "-Xss2m"}) == (
        f"-XX:SharedArchiveFile={path} -Xmx1g -Xss2m")
    assert _settings(False, {"spark_driver_extraJavaOptions": "-Xss4m"}, False)[
        EXTRA_OPTIONS] == f"-XX:SharedArchiveFile={path} -Xmx1g -Xss4m"


def test_without_an_archive_only_the_given_options_are_passed(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    assert driver_java_options({}) == ""
    assert EXTRA_OPTIONS not in _settings(False, {}, False)
    monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, "-XX:TieredStopAtLevel=1")
    assert driver_java_options({}) == "-XX:TieredStopAtLevel=1"


@pytest.mark.parametrize("given", [
    {"variable": "-XX:SharedArchiveFile=/elsewhere.jsa"},
    {"variable": "-XX:ArchiveClassesAtExit=/tmp/new.jsa"},
    {"session": "-Xshare:off"},
])
def test_a_caller_who_chose_class_sharing_gets_no_archive_added(
        cache: Path, monkeypatch: pytest.MonkeyPatch, given: dict[str, str]):
    _made()
    if "variable" in given:
        monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, given["variable"])
    settings = {EXTRA_OPTIONS: given["session"]} if "session" in given else {}
    assert "SharedArchiveFile=" + str(cache) not in driver_java_options(settings)
    assert driver_java_options(settings) == next(iter(given.values()))


def test_an_archive_others_can_write_to_is_not_used(cache: Path):
    _made(0o666)
    assert driver_java_options({}) == ""


def test_an_archive_under_a_path_with_white_space_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "my cache"))
    monkeypatch.delenv(DRIVER_OPTIONS_VARIABLE, raising=False)
    _made()
    assert driver_java_options({}) == ""  # Spark would split the option at the space


def test_the_archive_is_named_by_pyspark_and_java(cache: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    first = archive_path()
    monkeypatch.setattr(pyspark, "__version__", "0.0.1")
    assert archive_path() not in (None, first)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert archive_path() is None


def test_prepare_leaves_an_archive_that_exists_alone(cache: Path):
    path = _made()
    result = CliRunner().invoke(prepare, [])
    assert result.exit_code == 0, result.output
    assert result.output == f"class archive up to date: {path}\n"
    assert path.read_bytes() == b"archive"


def test_a_training_run_that_takes_too_long_is_stopped_and_leaves_no_archive(tmp_path: Path):
    archive = tmp_path / "classes.jsa"
    began = os.times().elapsed
    with pytest.raises(Exception, match="the training run took over 1 s"):
        _train(tmp_path, archive, 1.0)
    assert os.times().elapsed - began < 30
    assert not archive.exists()
