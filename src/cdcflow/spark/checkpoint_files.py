"""Spark's checkpoint logs written without starting a process per file.

Every micro-batch logs its offsets and its commit in the query's checkpoint, each entry
written aside and renamed. Pip's pyspark has no Hadoop native library, so Hadoop's local
file system starts `chmod` for each file it creates and `readlink` twice for each rename:
three processes started by the JVM per entry, about 4 ms each here, so a batch's
`walCommit` and `commitOffsets` took about 20 and 30 ms (`bench/bench_spark.py`).

`java/LocalCheckpointFileManager.java` is Spark's FileContext-based manager with those three
calls made through java.nio on local paths (every other call, and every other file system,
stays Spark's). `cdcflow prepare` compiles it against this pyspark's jars with `javac` (a
JDK) into a jar in the user's cache (`jar_path`). A session whose JVM `session()` starts
gets the jar on its class path (`jar_settings`), and every session `session()` returns uses
the manager if its JVM can load it and the caller chose no manager (`use_manager`);
otherwise Spark's default manager runs as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition
from cdcflow.spark.class_archive import cache_folder, current_identity, private_cache_file

SOURCE = Path(__file__).parent / "java" / "LocalCheckpointFileManager.java"
MANAGER_CLASS = "cdcflow.jvm.LocalCheckpointFileManager"
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
JARS_KEY = "spark.jars"
JAR_PREFIX = "checkpoint-files-"
_COMPILE_SECONDS = 300


def jar_path() -> Path | None:
    """Where the jar for this Spark, this Java and this source lives; None without Spark or
    Java. Named by all three, so an upgrade of any asks for a new jar."""
    identity = current_identity()
    if identity is None:
        return None
    made_of = json.dumps(identity, sort_keys=True).encode() + SOURCE.read_bytes()
    return cache_folder() / f"{JAR_PREFIX}{hashlib.sha256(made_of).hexdigest()[:16]}.jar"


def usable_jar() -> Path | None:
    """The jar if `cdcflow prepare` made it and nobody else can have changed it. Its path
    must not hold a comma (spark.jars is a list) nor a space or quote."""
    return private_cache_file(jar_path(), unsafe=",")


def jar_settings(settings: dict[str, str]) -> dict[str, str]:
    """For a session that starts its JVM: the jar added to the caller's spark.jars; none if
    the caller chose a manager or jars another way (a spark-defaults.conf that names either,
    `--jars` in PYSPARK_SUBMIT_ARGS: this setting would replace theirs) or there is no
    usable jar."""
    if MANAGER_KEY in settings or _jars_chosen_elsewhere():
        return {}
    jar = usable_jar()
    if jar is None:
        return {}
    jars = [j for j in settings.get(JARS_KEY, "").split(",") if j]
    return {JARS_KEY: ",".join([*jars, str(jar)])}


def _jars_chosen_elsewhere() -> bool:
    if "--jars" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    folder = os.environ.get("SPARK_CONF_DIR") or (
        str(Path(os.environ["SPARK_HOME"]) / "conf") if os.environ.get("SPARK_HOME") else None)
    if folder is None:
        return False
    try:
        lines = (Path(folder) / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return False
    named = {line.replace("=", " ").split()[0] for line in lines if line.strip()}
    return bool(named & {JARS_KEY, MANAGER_KEY})


def use_manager(spark: Any, caller_chose: bool) -> bool:
    """Make the session's checkpoints use the manager if the caller chose none, none is set
    already, and the JVM can load the class (its jar reached the driver's class path):
    checked, so a JVM started without it (before `cdcflow prepare`, by spark-submit, by an
    earlier session of this process) keeps Spark's own manager and its queries run."""
    if caller_chose or spark.conf.get(MANAGER_KEY, None) is not None:
        return False
    if not spark._jvm.org.apache.spark.util.Utils.classIsLoadable(MANAGER_CLASS):
        return False
    spark.conf.set(MANAGER_KEY, MANAGER_CLASS)
    return True


def find_javac() -> Path:
    """$JAVA_HOME/bin/javac, else the javac on PATH; FailedPrecondition without either."""
    home = os.environ.get("JAVA_HOME")
    candidates = [Path(home) / "bin" / "javac"] if home else []
    on_path = shutil.which("javac")
    candidates += [Path(on_path)] if on_path else []
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FailedPrecondition(
        "no javac found (JAVA_HOME, PATH): compiling cdcflow's checkpoint file manager needs "
        "a JDK, for example Debian's openjdk-17-jdk-headless")


def build_jar(target: Path) -> None:
    """Compile the manager against this pyspark's jars and write the jar at `target`
    (written aside and renamed: a half-written jar is never where sessions look)."""
    identity = current_identity()
    if identity is None:
        raise FailedPrecondition("no java or no Spark jars found: Spark needs Java 17")
    javac = find_javac()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix=".checkpoint-files-", dir=target.parent) as folder:
        classes = Path(folder) / "classes"
        command = [str(javac), "--release", "17", "-nowarn", "-cp",
                   f"{identity['jars']}/*", "-d", str(classes), str(SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=_COMPILE_SECONDS, check=False)
        if done.returncode != 0:
            raise FailedPrecondition(
                f"javac could not compile {SOURCE.name} (exit status {done.returncode}): "
                f"{(done.stdout + done.stderr)[-2000:]}")
        written = Path(folder) / "manager.jar"
        with zipfile.ZipFile(written, "w", zipfile.ZIP_DEFLATED) as jar:
            for item in sorted(classes.rglob("*.class")):
                jar.write(item, item.relative_to(classes).as_posix())
        os.replace(written, target)

