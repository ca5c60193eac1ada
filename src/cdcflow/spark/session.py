"""A SparkSession set up for cdcflow: workers use this interpreter, loopback only when the
master is (see `on_loopback`), and a quiet console unless `verbose`: the JVM's own output (its
log at level ERROR, its startup warnings, anything an executor prints) goes to `log_path`, and
there are no progress bars."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdcflow.spark.checkpoint_files import MANAGER_KEY, jar_settings, use_manager
from cdcflow.spark.class_archive import (
    SUBMIT_OPTIONS_VARIABLE,
    cache_folder,
    owned_privately,
    submit_options,
)
from cdcflow.spark.master import check_master, is_local, standalone_addresses
from cdcflow.spark.shipping import package_zip

SUBMITTED = "PYSPARK_GATEWAY_PORT"
"""Set by spark-submit for the Python program it starts: its JVM, its --master."""

_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def _quiet_log_config() -> str:
    """A log4j2 configuration that lets only errors through, written once per user."""
    path = Path(tempfile.gettempdir()) / f"cdcflow-log4j2-quiet-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _QUIET_LOG4J:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(_QUIET_LOG4J)
        os.replace(temporary, path)
    return str(path)


def _spark_home_without_python_zips() -> str | None:
    """A SPARK_HOME for the pip-installed pyspark whose workers import pyspark from
    site-packages, or None where that does not apply (SPARK_HOME set, no pip layout).

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path. That
    zip holds sources only, so each worker process (the streaming source runner, the planners
    of every query) compiled pyspark anew: about 2 s of CPU per query start. This home links
    every entry of the installed package but `python`; the workers then find pyspark, with
    its compiled files, where pip put it. It lives in the user's cache, made atomically, and
    is used only if this user owns it and nobody else can write to it.
    """
    if os.environ.get("SPARK_HOME"):
        return None
    import pyspark

    package = Path(pyspark.__file__).parent
    if not (package / "jars").is_dir() or not (package / "python" / "lib").is_dir():
        return None
    cache = cache_folder()
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:16]
    home = cache / f"spark-home-{digest}"
    try:
        if not home.exists():
            _link_spark_home(package, cache, home)
    except OSError:
        return None
    return str(home) if owned_privately(home) else None


def _link_spark_home(package: Path, cache: Path, home: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    building = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=cache))
    for entry in package.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    building.chmod(0o755)
    try:
        building.rename(home)
    except OSError:  # another process made it first
        for link in building.iterdir():
            link.unlink()
        building.rmdir()


def on_loopback(master: str | None) -> bool:
    """A local master, or a standalone one whose every address is this machine's loopback:
    the driver then binds to 127.0.0.1 only. Executors on other machines must reach the
    driver, so there Spark picks its address (or spark.driver.host, SPARK_LOCAL_IP)."""
    if master is None:
        return False  # spark-submit's master: its settings decide
    return all(host in ("localhost", "::1") or host.startswith("127.")
               for host, _ in standalone_addresses(master))


UNCHECKSUMMED_LOCAL_FILES = {
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}
"""Local paths (`file:`) opened through Hadoop's FileContext (Spark's checkpoint logs) use the
raw local file system, without its `.crc` side files.

Every micro-batch logs its offsets and its commit in the checkpoint, each written aside and
renamed. With the checksummed default each write also writes, renames and checks a `.crc`
file: those two steps took about 38 and 46 ms a batch here, 18 and 22 ms without
(`bench/bench_spark.py [--checksummed-files]`: `walCommit` and `commitOffsets`). The renames
stay atomic; a damaged entry is no longer caught by a checksum. The FileSystem API
(`fs.file.impl`) stays checksummed: Hadoop's `FileSystem.getLocal`, which `sc.textFile` and
the other Hadoop-file reads call, requires that class. A checkpoint an older cdcflow wrote
continues (its side files are listed now, and ignored; a killed write's side file is removed
with the write, `cdcflow.spark.queries.remove_unfinished_writes`). A value of this key given
to `session(...)` wins; like cdcflow's other settings, this one wins over spark-defaults.conf
and spark-submit's --conf, and a SparkContext already running keeps its own."""


CRASH_TRACEBACKS = {
    "spark.python.worker.faulthandler.enabled": "true",
    "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
}
"""A Python worker that crashes (a fatal signal) leaves its Python stack in the task's
failure, which the runner records; without these, Spark says only that the worker "exited
unexpectedly (crashed)". Each task opens and removes one small file for it."""


SOCKETS_KEY = "spark.python.unix.domain.socket.enabled"
SOCKETS_DIR_KEY = "spark.python.unix.domain.socket.dir"
_SOCKET_NAME_LENGTH = 43
"""What pyspark adds to the folder for a socket's path: `/.<uuid4>.sock`."""
_SOCKET_PATH_LIMIT = 107
"""The longest path a Unix socket can have on Linux (sun_path, less its final zero)."""


def worker_sockets(master: str | None) -> dict[str, str]:
    """With a local master, Python workers (and accumulators) talk to their JVM over Unix
    domain sockets in a private folder, not TCP on the loopback (Spark 4.1's option, off by
    default; Spark 4.0 ignores it).

    Over TCP every task stalled: its Python worker sat in a socket read for the task's first
    input, about 30 ms, while its JVM task used 3-4 ms of CPU in all (py-spy and Spark's task
    metrics). Over a Unix socket the stall is gone: `bench/bench_spark.py`'s source at 1,000
    mods a batch went from 172 to 108 ms of addBatch a batch (with
    `cdcflow.spark.worker_heap` as well, to 63-72 ms).

    Over a Unix socket pyspark's daemon and accumulator server skip their secret: a socket
    file's permissions decide who may connect. So the sockets go to a folder of this
    process's own, mode 0700 (`tempfile.mkdtemp`), removed at exit, or by the next session
    of this user after a kill (`remove_stale_socket_folders`). Only a local master gets
    this: a cluster's executors are on other machines, where that folder is not. Nothing is
    set (TCP stays) when the folder's path is too long for a socket's, or with spark-submit's
    master (None here), whose settings decide."""
    if master is None or not is_local(master):
        return {}
    folder = _private_socket_folder()
    if folder is None:
        return {}
    return {SOCKETS_KEY: "true", SOCKETS_DIR_KEY: folder}


SOCKET_FOLDER_PREFIX = "cdcflow-sockets-"


@functools.cache
def _private_socket_folder() -> str | None:
    """`<temp>/cdcflow-sockets-<pid>-<random>`, made once per process."""
    remove_stale_socket_folders(Path(tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=f"{SOCKET_FOLDER_PREFIX}{os.getpid()}-")
    if len(folder) + _SOCKET_NAME_LENGTH > _SOCKET_PATH_LIMIT:
        os.rmdir(folder)
        return None
    atexit.register(shutil.rmtree, folder, True)
    return folder


def remove_stale_socket_folders(parent: Path) -> list[Path]:
    """Remove the socket folders of this user's processes that are gone (a killed process
    runs no exit handler, so its folder stays); the folders removed. A process is gone when
    signal 0 finds no such pid. A folder whose pid another process reuses stays: it is
    empty of live sockets, and small."""
    removed = []
    for folder in parent.glob(f"{SOCKET_FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(SOCKET_FOLDER_PREFIX).split("-", 1)[0]
        try:
            if not pid.isdigit() or folder.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:  # gone meanwhile, or a process of another user: not ours to judge
            continue
    return removed


def _settings(verbose: bool, conf: dict[str, str], loopback: bool,
              master: str | None = None) -> dict[str, str]:
    settings = UNCHECKSUMMED_LOCAL_FILES | worker_sockets(master) | {
        "spark.sql.shuffle.partitions": "4",
        # A batch's fold and writes run in the tasks after its shuffle by key; adaptive
        # execution coalesced a batch's few megabytes into one task, so one core did them.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
    } | CRASH_TRACEBACKS
    if loopback:
        settings |= {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    if not verbose:
        settings["spark.ui.showConsoleProgress"] = "false"
    return settings | {key.replace("_", "."): value for key, value in conf.items()}


def _jvm_running() -> bool:
    """Whether this process has a JVM already: pyspark keeps it after a context stops."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _start_context(app_name: str, master: str | None, settings: dict[str, str],
                   log_path: str | None, verbose: bool) -> None:
    """Start the JVM and the SparkContext; unless `verbose`, the JVM's stdout and stderr go
    to `log_path`."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None:
        return
    spark_conf = SparkConf().setAppName(app_name).setAll(list(settings.items()))
    if master is not None:
        spark_conf.setMaster(master)
    with _launch_environment(settings, master is not None and is_local(master)):
        if verbose:
            SparkContext(conf=spark_conf)
            return
        path = Path(log_path or Path(tempfile.gettempdir()) / f"cdcflow-spark-{os.getpid()}.log")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:  # the JVM keeps its own descriptor
            gateway = launch_gateway(  # type: ignore[no-untyped-call]
                spark_conf, popen_kwargs={"stdout": log, "stderr": log})
    SparkContext(conf=spark_conf, gateway=gateway)


@contextlib.contextmanager
def _launch_environment(settings: dict[str, str], local: bool = False) -> Iterator[None]:
    """SPARK_SUBMIT_OPTS as `submit_options` gives it (the class archive; C1 only for a
    `local` master), while the JVM is launched; as it was afterwards."""
    before = os.environ.get(SUBMIT_OPTIONS_VARIABLE)
    options = submit_options(settings, local)
    if options:
        os.environ[SUBMIT_OPTIONS_VARIABLE] = options
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SUBMIT_OPTIONS_VARIABLE, None)
        else:
            os.environ[SUBMIT_OPTIONS_VARIABLE] = before


class _HeldInterrupts:
    """Hold Ctrl-C (SIGINT) while a session starts; raise it as KeyboardInterrupt at the end.

    Interrupted while it waits for the JVM, pyspark's launcher deletes the folder the JVM is
    about to write its connection details to; the JVM's main thread then ends without exiting
    and its gateway thread keeps it alive for good, with no parent. Interrupted later, the
    handler SparkContext installs cancels jobs through a py4j call that may meet another in
    flight, and py4j logs a traceback. Once the session is up, the JVM exits by itself when
    this process ends (end of file on its stdin). Works in the main thread only; elsewhere
    signals are not delivered anyway."""

    def __init__(self) -> None:
        self.active = threading.current_thread() is threading.main_thread()
        self.held = False
        self.restore: Any = None

    def _hold(self, _signum: int, _frame: Any) -> None:
        self.held = True

    def __enter__(self) -> _HeldInterrupts:
        if self.active:
            self.restore = signal.signal(signal.SIGINT, self._hold)
        return self

    def keep(self) -> None:
        """Hold again after a step that installed its own handler (SparkContext's): that
        handler is the one restored at the end."""
        if self.active and signal.getsignal(signal.SIGINT) != self._hold:
            self.restore = signal.signal(signal.SIGINT, self._hold)

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if self.active:
            self.keep()
            signal.signal(signal.SIGINT, self.restore)
        if kind is None and self.held:
            raise KeyboardInterrupt


def session(app_name: str = "cdcflow", master: str | None = None, verbose: bool = False,
            log_path: str | None = None, **conf: str) -> Any:
    """Get or create a SparkSession with the "cdcflow" data source registered.

    The master is `master`; without one, spark-submit's `--master` when spark-submit started
    this process, else local[*]. A master given here is checked first (`check_master`): one
    that can't be reached fails before a JVM starts. On a standalone cluster, cdcflow's own
    code is shipped to the executors (`cdcflow.spark.shipping`)."""
    if master is None and SUBMITTED not in os.environ:
        master = "local[*]"
    if master is not None:
        check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    loopback = on_loopback(master)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    home = _spark_home_without_python_zips()
    if home is not None:
        os.environ["SPARK_HOME"] = home
    from pyspark.sql import SparkSession

    from cdcflow.spark.source import ChangeStreamSource

    settings = _settings(verbose, conf, loopback, master)
    if SUBMITTED not in os.environ and not _jvm_running():  # this call starts the JVM
        settings |= jar_settings(settings)
    if master is not None and standalone_addresses(master):  # executors import this cdcflow
        shipped = [p for p in settings.get("spark.submit.pyFiles", "").split(",") if p]
        settings["spark.submit.pyFiles"] = ",".join([str(package_zip()), *shipped])
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if not verbose:  # log4j2 reads this from the environment the JVM inherits
        os.environ.setdefault("LOG4J_CONFIGURATION_FILE", _quiet_log_config())
    with _HeldInterrupts() as interrupts:
        _start_context(app_name, master, settings, log_path, verbose)
        interrupts.keep()
        spark = builder.getOrCreate()
        if not verbose:
            spark.sparkContext.setLogLevel("ERROR")
        if master is None and str(spark.sparkContext.master).startswith("spark://"):
            spark.sparkContext.addPyFile(str(package_zip()))  # before the source captures
        spark.dataSource.register(ChangeStreamSource)  # the files its workers get
        use_manager(spark, MANAGER_KEY in settings)
    return spark
