"""`cdcflow prepare`: make the driver JVM's class archive (see cdcflow.spark.class_archive)
and compile the checkpoint file manager (see cdcflow.spark.checkpoint_files).

The archive is written by a JVM as it exits, holding the classes that run loaded. So this
runs `cdcflow demo` briefly as the training run, in a session of its own, waits until every
process of that session (the demo, its JVM and their Python workers) has ended, and only then
moves the archive into the cache: a half-written archive is never where sessions look.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click

from cdcflow.errors import FailedPrecondition
from cdcflow.spark.checkpoint_files import build_jar, jar_path, usable_jar
from cdcflow.spark.class_archive import (
    ARCHIVE_PREFIX,
    DRIVER_OPTIONS_VARIABLE,
    archive_path,
    current_identity,
    identity_file,
    outdated,
    usable_archive,
)
from cdcflow.streams.lease import stat_fields

TRAINING_SECONDS = "3"


def _session_members(session_id: int) -> list[int]:
    """Live processes whose session is `session_id`, from /proc (fields 3 and 6 of each
    stat). An ended JVM whose parent is gone stays a zombie where nobody reaps orphans."""
    members = []
    for pid in (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
        fields = stat_fields(pid)  # None: it ended meanwhile
        if fields is not None and int(fields[3]) == session_id and fields[0] != "Z":
            members.append(pid)  # a zombie has ended
    return members


def _kill_session(session_id: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # all of it ended meanwhile
        os.killpg(session_id, signal.SIGKILL)


def _train(folder: Path, archive: Path, seconds: float) -> None:
    """Run the demo with a JVM that writes `archive` as it exits; wait for all of it."""
    env = os.environ | {DRIVER_OPTIONS_VARIABLE: f"-XX:ArchiveClassesAtExit={archive}"}
    command = [sys.executable, "-m", "cdcflow.cli.main", "demo", "--duration",
               TRAINING_SECONDS, "--json", "--output", str(folder / "demo")]
    deadline = time.monotonic() + seconds
    with open(folder / "training.log", "wb") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=log,
                                 start_new_session=True)
        try:
            code = child.wait(seconds)
        except subprocess.TimeoutExpired:
            _kill_session(child.pid)
            child.wait()
            raise click.ClickException(f"the training run took over {seconds:.0f} s") from None
    while _session_members(child.pid):
        if time.monotonic() > deadline:
            _kill_session(child.pid)
            raise click.ClickException(f"the training run's JVM did not end in {seconds:.0f} s")
        time.sleep(0.2)
    if code != 0 or not archive.is_file() or archive.stat().st_size == 0:
        tail = (folder / "training.log").read_text(errors="replace")[-2000:]
        raise click.ClickException(f"the training run (exit status {code}) wrote no class "
                                   f"archive; its output ends with:\n{tail}")


def _remove_outdated(target: Path) -> None:
    for other in target.parent.glob(f"{ARCHIVE_PREFIX}*.jsa"):  # Spark or Java reinstalled
        if other != target and outdated(other):
            other.unlink(missing_ok=True)
            identity_file(other).unlink(missing_ok=True)


def _make(target: Path, timeout: float) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
    try:
        _train(folder, folder / "classes.jsa", timeout)
        identity_file(target).write_text(json.dumps(current_identity()))
        os.replace(folder / "classes.jsa", target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _prepare_archive(force: bool, timeout: float) -> None:
    target = archive_path()
    if target is None:
        raise click.ClickException("no java found (JAVA_HOME, PATH): Spark needs Java 17")
    try:
        _remove_outdated(target)
        if usable_archive() == target and not force:
            click.echo(f"class archive up to date: {target}")
            return
        began = time.monotonic()
        _make(target, timeout)
    except OSError as error:
        raise click.ClickException(f"cannot make the class archive in {target.parent}: "
                                   f"{error}") from None
    if usable_archive() != target:
        raise click.ClickException(
            f"sessions would not use the class archive {target}: its folder must be this "
            "user's alone, and its path must hold no space or quote (set XDG_CACHE_HOME)")
    click.echo(f"class archive made in {time.monotonic() - began:.0f} s: {target} "
               f"({target.stat().st_size / 2**20:.0f} MiB)")


def _prepare_checkpoint_jar(force: bool) -> None:
    target = jar_path()
    if target is None:
        raise click.ClickException("no java found (JAVA_HOME, PATH): Spark needs Java 17")
    if usable_jar() == target and not force:
        click.echo(f"checkpoint file manager up to date: {target}")
        return
    try:
        build_jar(target)
    except (OSError, subprocess.SubprocessError, FailedPrecondition) as error:
        raise click.ClickException(
            f"cannot compile the checkpoint file manager into {target}: {error}; sessions "
            "keep Spark's own, which starts processes for every checkpoint file") from None
    if usable_jar() != target:
        raise click.ClickException(
            f"sessions would not use the checkpoint file manager {target}: its folder must "
            "be this user's alone, and its path must hold no space, comma or quote")
    click.echo(f"checkpoint file manager compiled: {target}")


@click.command()
@click.option("--force", is_flag=True, help="Make the archive and the jar again even if they "
              "exist.")
@click.option("--timeout", default=600.0, show_default=True,
              help="Seconds the training run may take.")
def prepare(force: bool, timeout: float) -> None:
    """Make what lets every Spark session of this cdcflow run with less time and CPU, once
    per virtual environment (its Spark) and Java: the class archive, by running the demo for
    a few seconds to learn which classes a session loads; and the checkpoint file manager,
    compiled with javac, which writes checkpoint entries without starting processes."""
    failures = []
    steps: list[Callable[[], None]] = [lambda: _prepare_archive(force, timeout),
                                       lambda: _prepare_checkpoint_jar(force)]
    for step in steps:
        try:
            step()
        except click.ClickException as failure:  # the other step is still worth making
            click.echo(f"Error: {failure.message}", err=True)
            failures.append(failure.message)
    if failures:
        raise click.ClickException(f"{len(failures)} of 2 steps failed (above)")
