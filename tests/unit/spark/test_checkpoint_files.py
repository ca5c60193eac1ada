"""Compiling the checkpoint file manager and giving its jar to a new JVM
(cdcflow.spark.checkpoint_files); the manager's behaviour in a JVM is
tests/integration/spark/test_checkpoint_manager_jvm.py."""

from __future__ import annotations

import zipfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cdcflow.cli import prepare as prepare_module
from cdcflow.errors import FailedPrecondition
from cdcflow.spark import checkpoint_files
from cdcflow.spark.checkpoint_files import (
    JARS_KEY,
    MANAGER_KEY,
    build_jar,
    find_javac,
    jar_path,
    jar_settings,
    usable_jar,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cdcflow"


def test_the_jar_holds_the_manager_and_a_new_jvm_gets_it(cache: Path):
    assert jar_settings({}) == {}, "no jar yet: Spark's own manager"
    target = jar_path()
    assert target is not None and target.parent == cache
    build_jar(target)
    with zipfile.ZipFile(target) as jar:
        assert "cdcflow/jvm/LocalCheckpointFileManager.class" in jar.namelist()
    assert usable_jar() == target
    assert jar_settings({}) == {JARS_KEY: str(target)}
    assert jar_settings({JARS_KEY: "/opt/a.jar,/opt/b.jar"})[JARS_KEY] == (
        f"/opt/a.jar,/opt/b.jar,{target}")
    assert jar_settings({MANAGER_KEY: "com.example.Theirs"}) == {}
    target.chmod(0o666)  # others could have changed it
    assert usable_jar() is None and jar_settings({}) == {}


@pytest.mark.parametrize("line", [f"{JARS_KEY} /opt/theirs.jar", f"{MANAGER_KEY}=x.Theirs"])
def test_jars_or_a_manager_in_spark_defaults_are_left_alone(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str):
    target = jar_path()
    assert target is not None
    build_jar(target)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.ui.enabled false\n{line}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert jar_settings({}) == {}, "spark.jars given here would replace the defaults' own"
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--jars /opt/theirs.jar pyspark-shell")
    assert jar_settings({}) == {}


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


def test_prepare_still_compiles_the_manager_when_the_archive_fails(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    def no_archive(force: bool, timeout: float) -> None:
        raise click.ClickException("the training run took over 1 s")

    monkeypatch.setattr(prepare_module, "_prepare_archive", no_archive)
    result = CliRunner().invoke(prepare_module.prepare, [])
    assert result.exit_code == 1
    assert "Error: the training run took over 1 s" in result.output
    assert "1 of 2 steps failed" in result.output
    assert f"checkpoint file manager compiled: {jar_path()}" in result.output
    assert usable_jar() == jar_path()
