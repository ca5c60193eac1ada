"""Compiling the checkpoint file manager and choosing it for a session
(cdcflow.spark.checkpoint_files); the manager's behaviour in a JVM is
tests/integration/spark/test_checkpoint_manager_jvm.py."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from cdcflow.errors import FailedPrecondition
from cdcflow.spark import checkpoint_files
from cdcflow.spark.checkpoint_files import (
    JARS_KEY,
    MANAGER_CLASS,
    MANAGER_KEY,
    build_jar,
    checkpoint_settings,
    find_javac,
    jar_path,
    usable_jar,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "cdcflow"


def test_the_jar_holds_the_manager_and_sessions_then_choose_it(cache: Path):
    assert checkpoint_settings({}) == {}, "no jar yet: Spark's own manager"
    target = jar_path()
    assert target is not None and target.parent == cache
    build_jar(target)
    with zipfile.ZipFile(target) as jar:
        assert "cdcflow/jvm/LocalCheckpointFileManager.class" in jar.namelist()
    assert usable_jar() == target
    assert checkpoint_settings({}) == {MANAGER_KEY: MANAGER_CLASS, JARS_KEY: str(target)}
    assert checkpoint_settings({JARS_KEY: "/opt/a.jar,/opt/b.jar"})[JARS_KEY] == (
        f"/opt/a.jar,/opt/b.jar,{target}")
    assert checkpoint_settings({MANAGER_KEY: "com.example.Theirs"}) == {}
    target.chmod(0o666)  # others could have changed it
    assert usable_jar() is None and checkpoint_settings({}) == {}


def test_a_changed_source_asks_for_another_jar(cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch):
    before = jar_path()
    changed = tmp_path / "LocalCheckpointFileManager.java"
    changed.write_text(checkpoint_files.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(checkpoint_files, "SOURCE", changed)
    assert jar_path() not in (None, before)


def test_a_source_javac_refuses_is_an_error_naming_it_and_writes_no_jar(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    broken = tmp_path / "LocalCheckpointFileManager.java"
    broken.write_text("package cdcflow.jvm; public class LocalCheckpointFileManager {")
    monkeypatch.setattr(checkpoint_files, "SOURCE", broken)
    target = jar_path()
    assert target is not None
    with pytest.raises(FailedPrecondition, match=r"javac could not compile "
                       r"LocalCheckpointFileManager\.java"):
        build_jar(target)
    assert not target.exists()
    assert [p.name for p in cache.iterdir()] == [], "its scratch folder is gone"


def test_without_a_jdk_the_error_names_javac_and_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FailedPrecondition, match=r"no javac found .*openjdk-17-jdk-headless"):
        find_javac()
