"""The driver JVM's class archive (issue 14: a killed runner starts again sooner): where it
lives, when a session uses it, and how its options combine with the caller's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from cdcflow.cli.prepare import _session_members, _train, prepare
from cdcflow.spark.checkpoint_files import jar_path
from cdcflow.spark.class_archive import (
    DRIVER_OPTIONS_VARIABLE,
    LOCAL_JIT_OPTION,
    SUBMIT_OPTIONS_VARIABLE,
    _identity,
    archive_path,
    identity_file,
    submit_options,
)
from cdcflow.spark.session import _launch_environment, _settings
from cdcflow.spark.session import _spark_home_without_python_zips as spark_home
from cdcflow.streams.lease import process_state

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(DRIVER_OPTIONS_VARIABLE, raising=False)
    for name in (SUBMIT_OPTIONS_VARIABLE, "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cdcflow"


def _made(mode: int = 0o444) -> Path:
    """An archive where `cdcflow prepare` puts it (its content is the JVM's to check)."""
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"archive")
    path.chmod(mode)
    return path


def test_the_archive_comes_first_then_the_variable_then_what_submit_options_held(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    path = _made()
    assert path.parent == cache
    monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, " -Xss2m ")
    monkeypatch.setenv(SUBMIT_OPTIONS_VARIABLE, "-Dinherited=1")
    assert submit_options({"spark.driver.extraJavaOptions": "-Xss4m"}) == (
        f"-XX:SharedArchiveFile={path} -Xss2m -Dinherited=1")


def test_a_launch_sets_submit_options_for_the_jvm_only_and_leaves_spark_options_alone(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    """spark.driver.extraJavaOptions stays the caller's (a spark-defaults.conf value would be
    overridden by one cdcflow passed as --conf)."""
    path = _made()
    monkeypatch.delenv(SUBMIT_OPTIONS_VARIABLE, raising=False)
    assert "spark.driver.extraJavaOptions" not in _settings(False, {}, False)
    with _launch_environment({}):
        assert os.environ[SUBMIT_OPTIONS_VARIABLE] == f"-XX:SharedArchiveFile={path}"
    assert SUBMIT_OPTIONS_VARIABLE not in os.environ
    monkeypatch.setenv(SUBMIT_OPTIONS_VARIABLE, "-Dmine=1")
    with _launch_environment({}):
        assert os.environ[SUBMIT_OPTIONS_VARIABLE] == f"-XX:SharedArchiveFile={path} -Dmine=1"
    assert os.environ[SUBMIT_OPTIONS_VARIABLE] == "-Dmine=1"


def test_without_an_archive_only_the_given_options_are_passed(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(SUBMIT_OPTIONS_VARIABLE, raising=False)
    assert submit_options({}) == ""
    monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, "-XX:TieredStopAtLevel=1")
    assert submit_options({}) == "-XX:TieredStopAtLevel=1"


@pytest.mark.parametrize("where,value", [
    (DRIVER_OPTIONS_VARIABLE, "-XX:SharedArchiveFile=/elsewhere.jsa"),
    (DRIVER_OPTIONS_VARIABLE, "-XX:ArchiveClassesAtExit=/tmp/new.jsa"),
    (SUBMIT_OPTIONS_VARIABLE, "-Xshare:off"),
    ("JAVA_TOOL_OPTIONS", "-Xshare:off"),
    ("spark.driver.extraJavaOptions", "-Xshare:off"),
    ("spark.driver.defaultJavaOptions", "-XX:SharedArchiveFile=/admin.jsa"),
])
def test_a_caller_who_chose_class_sharing_gets_no_archive_added(
        cache: Path, monkeypatch: pytest.MonkeyPatch, where: str, value: str):
    _made()
    monkeypatch.delenv(SUBMIT_OPTIONS_VARIABLE, raising=False)
    settings = {where: value} if where.startswith("spark.") else {}
    if not settings:
        monkeypatch.setenv(where, value)
    passed_on = where in (DRIVER_OPTIONS_VARIABLE, SUBMIT_OPTIONS_VARIABLE)
    assert submit_options(settings) == (value if passed_on else "")


def test_a_local_master_gets_c1_only_after_the_archive_and_before_the_callers_options(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    path = _made()
    assert submit_options({}, local=True) == f"-XX:SharedArchiveFile={path} {LOCAL_JIT_OPTION}"
    assert submit_options({}, local=False) == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv(DRIVER_OPTIONS_VARIABLE, "-Xss2m")
    assert submit_options({}, local=True) == (
        f"-XX:SharedArchiveFile={path} {LOCAL_JIT_OPTION} -Xss2m")
    with _launch_environment({}, local=True):
        assert LOCAL_JIT_OPTION in os.environ[SUBMIT_OPTIONS_VARIABLE]
    with _launch_environment({}):
        assert LOCAL_JIT_OPTION not in os.environ[SUBMIT_OPTIONS_VARIABLE]


@pytest.mark.parametrize("where,value", [
    (DRIVER_OPTIONS_VARIABLE, "-XX:TieredStopAtLevel=4"),
    (DRIVER_OPTIONS_VARIABLE, "-XX:-TieredCompilation"),
    (SUBMIT_OPTIONS_VARIABLE, "-Xint"),
    ("JAVA_TOOL_OPTIONS", "-XX:CompilationMode=high-only"),
    ("spark.driver.extraJavaOptions", "-Xcomp"),
    ("spark.driver.defaultJavaOptions", "-XX:TieredStopAtLevel=3"),
])
def test_a_caller_who_chose_the_compilers_gets_no_jit_option_added(
        cache: Path, monkeypatch: pytest.MonkeyPatch, where: str, value: str):
    settings = {where: value} if where.startswith("spark.") else {}
    if not settings:
        monkeypatch.setenv(where, value)
    assert LOCAL_JIT_OPTION not in submit_options(settings, local=True)


def test_an_archive_others_can_write_to_or_swap_is_not_used(cache: Path):
    path = _made(0o666)
    assert submit_options({}) == ""
    path.chmod(0o444)
    assert submit_options({}) != ""
    cache.chmod(0o777)  # its folder: anyone could put another file in its place
    assert submit_options({}) == ""


@pytest.mark.parametrize("folder", ["my cache", "o'brien", 'say "hi"', "back\\slash"])
def test_an_archive_under_a_path_spark_would_split_or_unquote_is_not_used(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / folder))
    _made()
    assert submit_options({}) == ""  # the launcher parses spaces, quotes and backslashes


def test_a_zombie_is_not_counted_as_a_live_member_of_its_session():
    child = subprocess.Popen(["true"], start_new_session=True)
    deadline = time.monotonic() + 30
    while (process_state(child.pid) or ("gone", 0))[0] != "Z":  # ended, not reaped
        assert time.monotonic() < deadline, "the child never ended"
        time.sleep(0.01)
    assert _session_members(child.pid) == []
    child.wait()
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert _session_members(sleeper.pid) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()


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
    jar = jar_path()
    assert jar is not None
    assert result.output == (f"class archive up to date: {path}\n"
                             f"checkpoint file manager compiled: {jar}\n")
    assert path.read_bytes() == b"archive"
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [path.name, current.name, identity_file(current).name, unknown.name, damaged.name,
         identity_file(damaged).name, jar.name])
    assert not reinstalled.exists() and not gone.exists()


def test_a_training_run_that_takes_too_long_is_stopped_and_leaves_no_archive(tmp_path: Path):
    archive = tmp_path / "classes.jsa"
    began = os.times().elapsed
    with pytest.raises(Exception, match="the training run took over 1 s"):
        _train(tmp_path, archive, 1.0)
    assert os.times().elapsed - began < 30
    assert not archive.exists()
