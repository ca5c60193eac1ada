"""A class archive for the driver's JVM (AppCDS), so a Spark session starts in less CPU.

A JVM that starts Spark and runs its first query loads and verifies about 20,000 classes.
Java 17 can write the classes a run loaded into an archive when it exits
(`-XX:ArchiveClassesAtExit`) and map them from it in later runs (`-XX:SharedArchiveFile`).
Here that took a session plus its first streaming query from 11.5 s to 7.9 s, and the JVM's
CPU from 15.9 s to 10.0 s (bench/bench_session_start.py; issue 14: a killed runner is back
sooner).

`cdcflow prepare` makes the archive once per virtual environment and Java (`archive_path`);
from then on every session this cdcflow starts uses it (`submit_options`). The JVM checks
the archive itself: one made by another Java build, or for other jars, is ignored with a
warning in the Spark log, and the session starts as it would without it.

With a local master the driver JVM also gets `-XX:TieredStopAtLevel=1`
(`LOCAL_JIT_OPTION`): its JIT compiles with C1 only. In local mode the executors run in that
JVM, and every new query and micro-batch brings Spark code paths and generated classes to
compile. C2 spent 1.0-1.2 s of CPU in a 1.8 s query of `bench/bench_spark.py` still in its
second query, and 0.3 s by the eighth, on cores the Python workers need. With C1 only:
`bench_spark` 0.55-0.59 -> 0.63-0.68 of the plain loop, `bench_throughput`'s drain
42.1-43.5k -> 44.9-47.1k changes/s. A caller who chooses the compilers (`_JIT_FLAGS`) gets
none of this; a cluster's driver and executors are left alone.

CDCFLOW_DRIVER_JAVA_OPTIONS adds options of the caller's to the driver JVM. It and the
options above reach the JVM through SPARK_SUBMIT_OPTS, so a `spark.driver.extraJavaOptions`
of the caller's (the session's or spark-defaults.conf's) stays as it was and comes last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

DRIVER_OPTIONS_VARIABLE = "CDCFLOW_DRIVER_JAVA_OPTIONS"
SUBMIT_OPTIONS_VARIABLE = "SPARK_SUBMIT_OPTS"
_DRIVER_OPTION_KEYS = ("spark.driver.defaultJavaOptions", "spark.driver.extraJavaOptions")
_JVM_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "PYSPARK_SUBMIT_ARGS")
ARCHIVE_PREFIX = "spark-classes-"
_CDS_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")
"""Options by which a caller chooses the class sharing himself; cdcflow then adds none."""
LOCAL_JIT_OPTION = "-XX:TieredStopAtLevel=1"
_JIT_FLAGS = ("TieredStopAtLevel", "TieredCompilation", "CompilationMode", "-Xint", "-Xcomp",
              "-Xmixed")
"""Options by which a caller chooses the JIT compilers himself; cdcflow then adds none."""


def cache_folder() -> Path:
    """The user's cache of cdcflow: $XDG_CACHE_HOME/cdcflow, else ~/.cache/cdcflow."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdcflow"


def owned_privately(path: Path) -> bool:
    """This user owns `path` (not followed if a link) and nobody else can write to it."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _java() -> Path | None:
    """The java that spark-submit runs: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _identity(jars: Path, java: Path) -> dict[str, object]:
    """What an archive was made for: the jars folder and the java, with their install
    times (a reinstall makes the folder anew)."""
    made = java.stat()
    return {"jars": str(jars), "jars_installed": jars.stat().st_mtime_ns, "java": str(java),
            "java_size": made.st_size, "java_installed": made.st_mtime_ns}


def current_identity() -> dict[str, object] | None:
    """The identity of this process's Spark and Java, or None without either."""
    import pyspark

    java = _java()
    jars = (Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
            / "jars").resolve()  # session()'s own SPARK_HOME links pyspark's
    if java is None or not jars.is_dir():
        return None
    return _identity(jars, java) | {"pyspark": pyspark.__version__}


def archive_path() -> Path | None:
    """Where the archive for this Spark's jars and this Java lives, or None without either.
    Named by both, so an upgrade or a reinstall of either asks for a new archive rather
    than finding one the JVM would refuse."""
    identity = current_identity()
    if identity is None:
        return None
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder() / f"{ARCHIVE_PREFIX}{digest}.jsa"


def identity_file(archive: Path) -> Path:
    return archive.with_suffix(".json")


def outdated(archive: Path) -> bool:
    """Whether the Spark or the Java an archive was made for is gone or was reinstalled
    (by its identity file); an archive without one is kept."""
    try:
        made_for = json.loads(identity_file(archive).read_text())
        jars, java = Path(made_for["jars"]), Path(made_for["java"])
        if not (jars.is_dir() and java.is_file()):
            return True
        now = _identity(jars, java)
        return now != {key: made_for[key] for key in now}
    except (OSError, ValueError, KeyError, TypeError):  # none, or not ours: keep it
        return False


def private_cache_file(path: Path | None, unsafe: str = "") -> Path | None:
    """`path` if it is a file nobody else can have changed (nor swapped in its folder) and
    its name holds no space, quote, backslash or character of `unsafe` (Spark's launcher
    splits options at spaces and parses quotes); else None."""
    if path is None or any(c.isspace() or c in "'\"\\" + unsafe for c in str(path)):
        return None
    private = path.is_file() and owned_privately(path) and owned_privately(path.parent)
    return path if private else None


def usable_archive() -> Path | None:
    """The archive if `cdcflow prepare` made it and nobody else can have changed it."""
    return private_cache_file(archive_path())


def submit_options(settings: dict[str, str], local: bool = False) -> str:
    """SPARK_SUBMIT_OPTS for the JVM a session launches: the archive's option (unless the
    caller chose class sharing himself), with a `local` master C1 only (unless the caller
    chose the compilers), CDCFLOW_DRIVER_JAVA_OPTIONS, then whatever SPARK_SUBMIT_OPTS held.
    Spark's launcher puts these before the driver's `spark.driver.defaultJavaOptions` and
    `extraJavaOptions`, which thus win, and which stay the caller's, from the session or
    from spark-defaults.conf."""
    ours = os.environ.get(DRIVER_OPTIONS_VARIABLE, "").strip()
    inherited = os.environ.get(SUBMIT_OPTIONS_VARIABLE, "").strip()
    chosen = [ours, inherited, *(os.environ.get(name, "") for name in _JVM_VARIABLES),
              *(settings.get(key, "") for key in _DRIVER_OPTION_KEYS)]
    archive = None if _mentioned(chosen, _CDS_FLAGS) else usable_archive()
    jit = LOCAL_JIT_OPTION if local and not _mentioned(chosen, _JIT_FLAGS) else ""
    return " ".join(part for part in (f"-XX:SharedArchiveFile={archive}" if archive else "",
                                      jit, ours, inherited) if part)


def _mentioned(options: list[str], flags: tuple[str, ...]) -> bool:
    return any(flag in text for text in options for flag in flags)
