"""A real Spark standalone cluster from the pip-installed pyspark, for tests and benchmarks:
one master and N workers, each worker in its own mount namespace where the given paths are
hidden (issue 15). Hiding needs `unshare` and the right to mount (root, as in the tests here).

The wheel has no start-master.sh: the master and the workers run through `spark-class`. Each
worker gets its own web UI port, work directory and local directory. A hidden path is covered
with an empty tmpfs inside the worker's namespace, so neither the worker nor its executors
(which inherit the namespace) can open anything under it; the virtualenv is bound back when
it lies under a hidden path, so that executors still find Python and the dependencies, but
not cdcflow's sources (an editable install points into the hidden tree). Workers may be
bound to CPUs of their own (`pinned`), as on machines of their own.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

START_DEADLINE = 180.0


def listen_ports(count: int) -> list[int]:
    """`count` distinct free ports below the kernel's range for outgoing connections: a port chosen
    from that range (as `cdcflow.localdb.free_port` does) can be taken as the local end of
    some connection before the process meant to listen there starts, and Spark then moves
    its server to the next port. The ports are held together while chosen."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = random.Random().sample(range(10_000, max(low, 10_000 + 4 * count)), 64 * count)
    with ExitStack() as held:
        chosen: list[int] = []
        for port in candidates:
            probe = held.enter_context(socket.socket())
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free ports below {low}")


def spark_class() -> str:
    found = Path(sys.executable).parent / "spark-class"
    return str(found) if found.exists() else str(shutil.which("spark-class"))


def _environment(home: Path, rest_port: int) -> dict[str, str]:
    environment = dict(os.environ)
    environment.update({
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(home / "local"),
        "SPARK_LOG_DIR": str(home / "logs"),
        "SPARK_MASTER_OPTS": f"-Dspark.master.rest.port={rest_port}",
        "PYSPARK_PYTHON": sys.executable,
    })
    environment.pop("SPARK_HOME", None)  # the pip layout's own home
    return environment


def _hiding_script(hidden: Sequence[Path], keep: Path, command: list[str]) -> str:
    """A shell script for `unshare --mount`: tmpfs over each hidden path, `keep` (the
    virtualenv) bound back where a hidden path covered it, then exec the command."""
    lines = ["set -e", f"mkdir -p /run/cdcflow-keep && mount --bind {shlex.quote(str(keep))} "
             "/run/cdcflow-keep"]
    for path in hidden:
        lines.append(f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(path))}")
        if keep.is_relative_to(path):
            lines.append(f"mkdir -p {shlex.quote(str(keep))} && mount --bind /run/cdcflow-keep "
                         f"{shlex.quote(str(keep))}")
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines)


def cpu_binding(index: int, cores: int, usable: Sequence[int]) -> list[str]:
    """`taskset` arguments that bind worker `index` to `cores` of the `usable` CPUs, the
    workers taking them in turn (wrapping round when there are more workers than CPUs)."""
    ordered = sorted(usable)
    chosen = {ordered[(index * cores + k) % len(ordered)] for k in range(cores)}
    return ["taskset", "--cpu-list", ",".join(str(cpu) for cpu in sorted(chosen))]


@dataclass
class Cluster:
    """A running standalone cluster; `url` is its master, `workers` its worker processes."""

    home: Path
    url: str = ""
    web_port: int = 0
    rest_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as r:
            return dict(json.load(r))

    def wait_for_workers(self, count: int, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            try:
                state = self.state()
                if state.get("status") == "ALIVE" and int(str(state["aliveworkers"])) >= count:
                    return
                last = state.get("aliveworkers")
            except (OSError, ValueError) as error:  # not serving yet, or an empty answer
                last = error
            for process in [self.master, *self.workers]:
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"a cluster process ended: {process.args!r}; "
                                       f"logs in {self.home}")
            time.sleep(0.2)
        raise TimeoutError(f"{count} workers did not register: last {last!r}; logs in {self.home}")

    def wait_for_rest(self, deadline: float) -> None:
        """Until the master's REST server answers on `rest_port` (it starts with the master,
        but nothing else waits for it)."""
        url = f"http://127.0.0.1:{self.rest_port}/v1/submissions/readyz"
        last: object = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    answer.read()
                    return
            except OSError as error:
                last = error
            time.sleep(0.2)
        raise TimeoutError(f"the master's REST server did not answer on port "
                           f"{self.rest_port}: {last!r}; logs in {self.home}")

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)


@contextmanager
def standalone_cluster(home: Path, workers: int = 2, hidden: Sequence[Path] = (),
                       cores: int = 1, pinned: bool = False) -> Iterator[Cluster]:
    """Start a master and `workers` workers of `cores` cores; stop them all at the end.

    `pinned` binds each worker, and all it starts (its executors and their Python workers),
    to `cores` CPUs of its own, taken in turn from the CPUs this process may use (`taskset`).
    Spark's `--cores` counts task slots, not CPUs: unpinned, a worker of one core runs its
    executor's JVM threads and its Python worker on every CPU of the machine, which a worker on
    a machine of one CPU could not."""
    home.mkdir(parents=True, exist_ok=True)
    port, web, rest, *worker_uis = listen_ports(3 + workers)
    environment = _environment(home, rest)
    cluster = Cluster(home, f"spark://127.0.0.1:{port}", web, rest)
    keep = Path(sys.prefix)
    usable = sorted(os.sched_getaffinity(0))
    try:
        with open(home / "master.out", "ab") as out:
            cluster.master = subprocess.Popen(
                [spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(web)],
                env=environment, stdout=out, stderr=subprocess.STDOUT, cwd=home)
        for index in range(workers):
            work = home / f"worker-{index}"
            (work / "local").mkdir(parents=True, exist_ok=True)
            command = [spark_class(), "org.apache.spark.deploy.worker.Worker", cluster.url,
                       "--host", "127.0.0.1", "--cores", str(cores), "--memory", "1g",
                       "--webui-port", str(worker_uis[index]), "--work-dir", str(work)]
            script = _hiding_script([Path(p) for p in hidden], keep, command)
            binding = cpu_binding(index, cores, usable) if pinned else []
            with open(home / f"worker-{index}.out", "ab") as out:
                cluster.workers.append(subprocess.Popen(
                    [*binding, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                     script],
                    env=environment | {"SPARK_LOCAL_DIRS": str(work / "local")},
                    stdout=out, stderr=subprocess.STDOUT, cwd=work))
        deadline = time.monotonic() + START_DEADLINE
        cluster.wait_for_workers(workers, deadline)
        cluster.wait_for_rest(deadline)
        yield cluster
    finally:
        cluster.stop()
