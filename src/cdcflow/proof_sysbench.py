"""A proof campaign for the MySQL/MariaDB source against a workload nobody in the project
wrote: sysbench's oltp_read_write.

`sysbench_campaign` starts a throwaway MariaDB, prepares sysbench's `sbtest` tables, defines a
stream in YAML (backfill of `sbtest.*`, then binlog CDC into CDC tables) and starts `cdcflow
run`; once it is up, `sysbench oltp_read_write` and the stream start together, and the
campaign SIGKILLs the whole runner (driver, JVM, capture worker) at chosen points: during the
backfill, at the handoff to CDC, and at random while streaming, each time starting it again.
When sysbench has ended, the campaign notes the server's binlog position, waits until the
stream's capture has reached it, drains the stream and compares every `sbtest.sbtestN` with
its CDC table by checksums over rows sorted by key.
The password reaches sysbench and the runner through the environment only.
The tests run a short campaign; `bench/bench_sysbench_campaign.py` a long one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from cdcflow.capture.mysql.position import GtidState
from cdcflow.capture.mysql.snapshot import quote
from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.localmaria import LocalMariaDB
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import log_path, open_source
from cdcflow.table import CdcTable

STREAM = "sysbench"
DATABASE = "sbtest"
KEY = "id"
PASSWORD_ENV = "CDCFLOW_SYSBENCH_PASSWORD"
SYSBENCH = "/usr/bin/sysbench"


@dataclass
class SysbenchCampaign:
    """The settings of one campaign and the kills it made."""

    folder: Path
    tables: int = 4
    table_size: int = 10_000
    threads: int = 4
    seconds: int = 60
    kills: int = 3
    rate: int | None = None
    """sysbench's --rate (transactions per second, all threads); None: as fast as it can."""
    chunk_rows: int = 1_000
    seed: int = 1
    killed: list[dict[str, Any]] = field(default_factory=list)


# ---- sysbench ------------------------------------------------------------------------------

def _sysbench(server: LocalMariaDB, campaign: SysbenchCampaign, output: Path,
              *args: str) -> subprocess.Popen[bytes]:
    """sysbench oltp_read_write against `sbtest` as the cdc user; the password goes in
    MYSQL_PWD (the client library reads it), never on the command line."""
    with output.open("wb") as out:
        return subprocess.Popen(
            [SYSBENCH, "oltp_read_write", "--mysql-host=127.0.0.1",
             f"--mysql-port={server.port}", "--mysql-user=cdc", f"--mysql-db={DATABASE}",
             f"--tables={campaign.tables}", f"--table-size={campaign.table_size}", *args],
            env=os.environ | {"MYSQL_PWD": server.password}, stdout=out,
            stderr=subprocess.STDOUT, cwd=campaign.folder)


def sysbench_figures(text: str) -> dict[str, float]:
    """The totals of a `sysbench ... run` report: transactions, queries, writes, errors."""
    figures: dict[str, float] = {}
    for name, pattern in (("transactions", r"transactions:\s+(\d+)"),
                          ("tps", r"transactions:\s+\d+\s+\(([\d.]+) per sec"),
                          ("queries", r"queries:\s+(\d+)"), ("writes", r"write:\s+(\d+)"),
                          ("ignored_errors", r"ignored errors:\s+(\d+)")):
        found = re.search(pattern, text)
        if found is not None:
            figures[name] = float(found.group(1))
    return figures


def _prepare(server: LocalMariaDB, campaign: SysbenchCampaign) -> None:
    """The database, the cdc user's rights on it (as root) and sysbench's tables."""
    server.sql(f"CREATE DATABASE {quote(DATABASE)}",
               f"GRANT ALL ON {quote(DATABASE)}.* TO 'cdc'@'127.0.0.1'")
    output = campaign.folder / "sysbench-prepare.txt"
    if _sysbench(server, campaign, output, "prepare").wait() != 0:
        raise RuntimeError(f"sysbench prepare failed: {output.read_text()[-2000:]}")


# ---- the stream and its runner -------------------------------------------------------------

def _definition(server: LocalMariaDB, campaign: SysbenchCampaign) -> StreamDefinition:
    """The stream's YAML definition, written beside the catalog (no password: only the name
    of the variable that holds it)."""
    text = yaml.safe_dump({
        "name": STREAM,
        "source": {"kind": "mysql", "host": "127.0.0.1", "port": server.port, "user": "cdc",
                   "password_env": PASSWORD_ENV, "databases": [DATABASE],
                   "chunk_rows": campaign.chunk_rows},
        "include": [f"{DATABASE}.*"], "backfill": "all",
        "destinations": [{"kind": "cdc_table", "warehouse": str(campaign.folder / "warehouse")}],
        "spark": {"trigger_seconds": 0.5}}, sort_keys=False)
    (campaign.folder / "stream.yaml").write_text(text)
    return StreamDefinition.from_yaml(text)


class _Runner:
    """`cdcflow run` as its own process group, killed and started again."""

    def __init__(self, folder: Path, password: str) -> None:
        self.folder, self.password = folder, password
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with (self.folder / f"runner-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
                 str(self.folder / "catalog.db"), "--master", "local[2]", "--json",
                 "--lease-seconds", "3"],  # a killed runner's restart takes its lease soon
                env=os.environ | {PASSWORD_ENV: self.password}, start_new_session=True,
                stdout=log, stderr=subprocess.STDOUT)

    def supervising(self) -> bool:
        """The latest runner has its Spark session up: it prints progress lines."""
        log = self.folder / f"runner-{self.starts}.log"
        return log.exists() and log.stat().st_size > 0

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill()


class _Watch:
    """Polls the catalog and the stream's change log with deadlines on the clock; a stream
    that failed for good stops every wait at once, naming its errors."""

    def __init__(self, catalog: Catalog, clock: Clock, definition: StreamDefinition,
                 home: Path, server: LocalMariaDB) -> None:
        self.catalog, self.clock, self.server = catalog, clock, server
        self.source = open_source(definition, home)  # for its source id and `reached`
        self.log_path = log_path(definition, home)
        self._log: ChangeLog | None = None

    def state(self) -> str:
        state = self.catalog.get(STREAM).state.value
        if state == "FAILED_PERMANENTLY":
            errors = [e["message"][:300] for e in self.catalog.errors(STREAM, 5)]
            raise RuntimeError(f"stream {STREAM!r} failed permanently: {errors}")
        return state

    def status(self, key: str, default: Any = None) -> Any:
        return self.catalog.status(STREAM).get(key, default)

    def log(self) -> ChangeLog | None:
        """The stream's change log, once the backfill has made it."""
        if self._log is None and Path(self.log_path).exists():
            self._log = ChangeLog.open(self.log_path, create=False)
        return self._log

    def server_position(self) -> dict[str, Any]:
        """The server's binlog position now (the end of the last committed transaction)."""
        ((log_file, position, *_),) = self.server.sql("SHOW MASTER STATUS")
        return {"log_file": str(log_file), "log_position": int(position)}

    def caught_up(self, mark: dict[str, Any]) -> bool:
        """Whether the capture has appended everything up to the binlog position `mark`."""
        log = self.log()
        return log is not None and self.source.reached(log, mark)

    def captured(self) -> dict[str, Any] | None:
        """The binlog position stored with the last transaction the capture appended."""
        log = self.log()
        stored = None if log is None else log.position(self.source.source_id)
        return None if stored is None else dict(stored.position)

    def wait(self, condition: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = self.clock.now() + timedelta(seconds=seconds)
        while not condition():
            self.state()  # a stream that failed for good ends the wait
            if self.clock.now() > deadline:
                raise TimeoutError(f"waited {seconds:.0f} s for {what}")
            self.clock.sleep(0.1)


def _kill_at_points(campaign: SysbenchCampaign, runner: _Runner, watch: _Watch,
                    workload: subprocess.Popen[bytes]) -> None:
    """The first kill in the backfill, the second at the handoff to CDC, the rest at random
    moments of sysbench's run, each once the restarted runner streams again."""
    rng = random.Random(campaign.seed)
    began = watch.clock.now()
    points = ["backfill", "handoff"] + [f"streaming {n}" for n in range(1, campaign.kills - 1)]
    for number, point in enumerate(points[:campaign.kills]):
        if point == "backfill":
            watch.wait(lambda: any(o.get("chunks") for o in
                                   (watch.status("backfill") or {}).values()), 600,
                       "the backfill to write a chunk")
        elif point == "handoff":
            watch.wait(lambda: watch.state() == "RUNNING", 600, "the handoff to CDC")
        else:
            _wait_resumed(watch, campaign.killed[-1], workload)
            left = campaign.seconds - (watch.clock.now() - began).total_seconds()
            watch.clock.sleep(rng.uniform(0.5, max(1.0, left / (len(points) - number))))
        backfill = watch.status("backfill") or {}
        campaign.killed.append({
            "at": point, "after_seconds": round((watch.clock.now() - began).total_seconds(), 1),
            "state": watch.state(), "captured": watch.captured(),
            "batches": watch.status("batches", 0),
            "backfill_chunks": sum(int(o.get("chunks", 0)) for o in backfill.values()),
            "sysbench_running": workload.poll() is None})
        runner.kill()
        watch.clock.sleep(rng.uniform(0, 1))
        runner.start()


def _wait_resumed(watch: _Watch, last_kill: dict[str, Any],
                  workload: subprocess.Popen[bytes]) -> None:
    """Until the restarted runner streams again: its Spark query has written a batch, or
    (sysbench having ended) its capture holds everything the server has."""

    def resumed() -> bool:
        if watch.state() != "RUNNING":
            return False
        if watch.status("batches", 0) > last_kill["batches"]:
            return True
        return workload.poll() is not None and watch.caught_up(watch.server_position())

    watch.wait(resumed, 600, "the restarted runner to stream again")


# ---- catching up and comparing -------------------------------------------------------------

def _catch_up(watch: _Watch, seconds: float) -> dict[str, Any]:
    """Wait (at most `seconds` a step) until the capture has appended everything up to the
    server's binlog position after the workload, then drain the stream into its tables
    (PAUSED). Says where the server, the capture and the backfill's snapshot stand, and how
    many transactions came through the binlog (after the snapshot)."""
    mark = watch.server_position()
    watch.wait(lambda: watch.caught_up(mark), seconds,
               f"the capture to reach the binlog position {mark}")
    watch.wait(lambda: watch.state() == "RUNNING", 600, "RUNNING before the drain")
    watch.catalog.act(STREAM, "drain")
    watch.wait(lambda: watch.state() == "PAUSED", seconds, "the drain")
    captured = watch.captured() or {}
    snapshot = watch.status("snapshot") or {}
    return {"server": mark, "captured": captured, "snapshot": snapshot,
            "cdc_transactions": transactions_between(str(snapshot.get("gtid", "")),
                                                     str(captured.get("gtid", "")))}


def transactions_between(first: str, last: str) -> int:
    """How many binlog transactions lie between two MariaDB GTID states (`d-s-n,...`)."""
    before = {domain: number for domain, _, number in GtidState.parse(first).domains}
    return sum(number - before.get(domain, 0)
               for domain, _, number in GtidState.parse(last).domains)


def _checksum(rows: list[dict[str, Any]]) -> str:
    return hashlib.md5("\n".join(repr(sorted(r.items())) for r in rows).encode(),
                       usedforsecurity=False).hexdigest()


def compare_rows(source: list[dict[str, Any]], copied: list[dict[str, Any]],
                 key: str = KEY) -> dict[str, Any]:
    """Both sides sorted by `key`, checksummed; where they differ, the keys missing from the
    copy, extra in it, and present in both with other values (the first few of each)."""
    source = sorted(source, key=lambda r: r[key])
    copied = sorted(copied, key=lambda r: r[key])
    check: dict[str, Any] = {"rows": len(source), "cdc_rows": len(copied),
                             "checksum": _checksum(source), "cdc_checksum": _checksum(copied)}
    check["equal"] = check["checksum"] == check["cdc_checksum"] and source == copied
    if not check["equal"]:
        mine, theirs = {r[key]: r for r in source}, {r[key]: r for r in copied}
        check["missing"] = sorted(set(mine) - set(theirs))[:20]
        check["extra"] = sorted(set(theirs) - set(mine))[:20]
        check["different"] = [{"source": mine[k], "cdc": theirs[k]} for k in sorted(
            set(mine) & set(theirs)) if mine[k] != theirs[k]][:5]
    return check


def _verify(server: LocalMariaDB, campaign: SysbenchCampaign) -> dict[str, Any]:
    conn = server.connect(database=DATABASE)
    checks: dict[str, Any] = {}
    try:
        for number in range(1, campaign.tables + 1):
            table = f"sbtest{number}"
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT * FROM {quote(DATABASE)}.{quote(table)} "
                               f"ORDER BY {quote(KEY)}")
                columns = [d[0] for d in cursor.description]
                source = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            name = f"{DATABASE}.{table}"
            copied = CdcTable.open(campaign.folder / "warehouse" / name).to_arrow().to_pylist()
            checks[name] = compare_rows(source, copied)
    finally:
        conn.close()
    return checks


def _password_leaks(folder: Path, password: str) -> list[str]:
    """The files of the campaign (definition, catalog, logs, change log, tables) that hold
    the password; there should be none."""
    secret = password.encode()
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*")
                  if path.is_file() and secret in path.read_bytes())


# ---- the campaign --------------------------------------------------------------------------

def _workload(server: LocalMariaDB, campaign: SysbenchCampaign, runner: _Runner,
              watch: _Watch) -> subprocess.Popen[bytes]:
    """Start the runner with the stream not started yet; once its Spark session is up, start
    sysbench and then the stream, so that the snapshot, the backfill and the handoff all
    happen under sysbench's writes, and nearly all of them reach the tables through the
    binlog, however long the runner took to start."""
    runner.start()
    watch.wait(runner.supervising, 600, "the runner to start")
    rate = [f"--rate={campaign.rate}"] if campaign.rate else []
    workload = _sysbench(server, campaign, campaign.folder / "sysbench-run.txt",
                         f"--threads={campaign.threads}", f"--time={campaign.seconds}",
                         "--report-interval=10", *rate, "run")
    watch.catalog.act(STREAM, "start")
    return workload


def _run(server: LocalMariaDB, campaign: SysbenchCampaign, runner: _Runner,
         clock: Clock) -> dict[str, Any]:
    _prepare(server, campaign)
    definition = _definition(server, campaign)
    catalog = Catalog(campaign.folder / "catalog.db")
    catalog.create(definition)
    watch = _Watch(catalog, clock, definition, campaign.folder, server)
    began = clock.now()
    workload = _workload(server, campaign, runner, watch)
    try:
        _kill_at_points(campaign, runner, watch, workload)
        code = workload.wait(timeout=campaign.seconds + 600)
    finally:
        if workload.poll() is None:
            workload.kill()
    output = (campaign.folder / "sysbench-run.txt").read_text()
    if code != 0:
        raise RuntimeError(f"sysbench run failed: {output[-2000:]}")
    positions = _catch_up(watch, 600 + 10 * campaign.seconds)  # a bound, not a pause
    status = catalog.status(STREAM)
    return {"seconds": round((clock.now() - began).total_seconds(), 1),
            "sysbench": sysbench_figures(output), "kills": campaign.killed,
            "runner_starts": runner.starts, "binlog": positions,
            "checks": _verify(server, campaign),
            "errors": [e["message"][:300] for e in catalog.errors(STREAM)],
            "status": {k: status.get(k) for k in ("state", "rows_processed", "batches",
                                                  "retries", "backfill", "capture")}}


def sysbench_campaign(campaign: SysbenchCampaign, clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    """Run the campaign; the report says what was run, killed, checked and found."""
    campaign.folder.mkdir(parents=True, exist_ok=True)
    server = LocalMariaDB.start()
    runner = _Runner(campaign.folder, server.password)
    try:
        report = _run(server, campaign, runner, clock)
    finally:
        runner.stop()
        server.stop()
    report["password_in_files"] = _password_leaks(campaign.folder, server.password)
    (campaign.folder / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report
