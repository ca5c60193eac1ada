"""The driver JVM's class archive (issue 14: a killed runner starts again sooner): where it
lives, when a session uses it, and how its options combine with the caller's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from cdcflow.cli.prepare import _train, prepare
from cdcflow.spark.class_archive import (
    DRIVER_OPTIONS_VARIABLE,
    EXTRA_OPTIONS,
    _identity,
    archive_path,
    driver_java_options,
    identity_file,
)
from cdcflow.spark.session import _settings
from cdcflow.spark.session import _spark_home_without_python_zips as spark_home

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


def test_the_archive_is_named_by_spark_and_java(cache: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    first = archive_path()
    home = spark_home()  # what session() sets: the same jars, so the same archive
    assert home is not None and first is not None
    monkeypatch.setenv("SPARK_HOME", home)
    assert archive_path() == first
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # a Spark of the user's, without jars
    assert archive_path() is None
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setattr(pyspark, "__version__", "0.0.1")
    assert archive_path() not in (None, first)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert archive_path() is None


def _other_archive(cache: Path, name: str, made_for: dict[str, object] | None) -> Path:
    archive = cache / f"spark-classes-{name}.jsa"
    archive.write_bytes(b"other")
    if made_for is not None:
        identity_file(archive).write_text(json.dumps(made_for))
    return archive


def test_prepare_keeps_the_archive_and_removes_only_those_of_a_spark_since_gone(
        cache: Path, tmp_path: Path):
    path = _made()
    jars, java = tmp_path / "jars", tmp_path / "java"
    jars.mkdir()
    java.write_bytes(b"java")
    current = _other_archive(cache, "current", _identity(jars, java))
    reinstalled = _other_archive(cache, "reinstalled", _identity(jars, java) | {
        "jars_installed": 1})
    unknown = _other_archive(cache, "unknown", None)
    damaged = _other_archive(cache, "damaged", None)
    identity_file(damaged).write_text("{not json")
    gone = _other_archive(cache, "gone", {**_identity(jars, java), "jars": str(tmp_path / "x")})
    result = CliRunner().invoke(prepare, [])
    assert result.exit_code == 0, result.output
    assert result.output == f"class archive up to date: {path}\n"
    assert path.read_bytes() == b"archive"
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [path.name, current.name, identity_file(current).name, unknown.name, damaged.name,
         identity_file(damaged).name])
    assert not reinstalled.exists() and not gone.exists()


def test_a_training_run_that_takes_too_long_is_stopped_and_leaves_no_archive(tmp_path: Path):
    archive = tmp_path / "classes.jsa"
    began = os.times().elapsed
    with pytest.raises(Exception, match="the training run took over 1 s"):
        _train(tmp_path, archive, 1.0)
    assert os.times().elapsed - began < 30
    assert not archive.exists()
