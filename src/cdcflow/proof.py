"""A proof campaign against a workload nobody in the project wrote: pgbench.

`pgbench_campaign` starts a throwaway PostgreSQL, initialises pgbench's tables, creates and
starts a stream (backfill plus CDC into CDC tables and JSON events) and runs `cdcflow run`
while `pgbench` runs, SIGKILLing the whole runner (driver, JVM, capture worker) at random
points: during the backfill, at the handoff to CDC, and while streaming. After pgbench ends
the stream drains, and the campaign compares every table with its CDC table row by row, and
the events of pgbench_history (no primary key) with its rows. The tests run a short one;
`bench/bench_pgbench_campaign.py` the long one.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.localdb import LocalPostgres, bin_dir
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.table import CdcTable

KEYED = {"public.pgbench_accounts": "aid", "public.pgbench_branches": "bid",
         "public.pgbench_tellers": "tid"}
PASSWORD_ENV = "CDCFLOW_PGBENCH_PASSWORD"


@dataclass
class Campaign:
    """The settings of one campaign and what it found."""

    folder: Path
    scale: int = 1
    clients: int = 4
    seconds: int = 20
    kills: int = 4
    rate: int | None = None
    seed: int = 1
    killed: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def _pgbench(server: LocalPostgres, *args: str) -> subprocess.Popen[bytes]:
    env = os.environ | {"PGPASSWORD": server.password}
    return subprocess.Popen([str(bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p",
                             str(server.port), "-U", "cdc", *args, "shop"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class _Runner:
    """`cdcflow run` as its own process group, killed and started again."""

    def __init__(self, campaign: Campaign, password: str) -> None:
        self.campaign, self.password = campaign, password
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.campaign.folder / f"runner-{self.starts}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
             str(self.campaign.folder / "catalog.db"), "--master", "local[2]", "--json",
             "--lease-seconds", "3"],  # a killed runner's restart takes its lease soon
            env=os.environ | {PASSWORD_ENV: self.password}, start_new_session=True,
            stdout=log, stderr=subprocess.STDOUT)

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


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def _phase(catalog: Catalog) -> str:
    state = catalog.get("pgbench").state.value
    return {"STARTING": "backfill", "RUNNING": "streaming"}.get(state, state.lower())


def _kill_at_points(campaign: Campaign, runner: _Runner, catalog: Catalog,
                    workload: subprocess.Popen[bytes]) -> None:
    """One kill in the backfill, one at the handoff, the rest at random while streaming."""
    rng = random.Random(campaign.seed)

    def kill(why: str) -> None:
        campaign.killed.append({"at": why, "phase": _phase(catalog),
                                "status": {k: v for k, v in catalog.status("pgbench").items()
                                           if k in ("backfill", "rows_processed")}})
        runner.kill()
        time.sleep(rng.uniform(0, 1))
        runner.start()

    _wait(lambda: any(o.get("chunks") for o in
                      (catalog.status("pgbench").get("backfill") or {}).values()), 300,
          "the backfill to write a chunk")
    kill("backfill")
    _wait(lambda: catalog.get("pgbench").state.value == "RUNNING", 600, "the handoff")
    kill("handoff")
    for number in range(campaign.kills - 2):
        time.sleep(rng.uniform(1, max(2.0, campaign.seconds / campaign.kills)))
        _wait(lambda: catalog.get("pgbench").state.value == "RUNNING", 600, "RUNNING")
        kill(f"streaming {number + 1}")
    workload.wait()


def _verify(campaign: Campaign, server: LocalPostgres) -> dict[str, Any]:
    import psycopg2
    from psycopg2 import sql

    conn = psycopg2.connect(server.dsn(), password=server.password)
    checks: dict[str, Any] = {}
    with conn.cursor() as cur:
        for name, key in KEYED.items():
            schema, table_name = name.split(".")
            cur.execute(sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
                sql.Identifier(schema), sql.Identifier(table_name), sql.Identifier(key)))
            columns = [d.name for d in cur.description]
            source = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
            table = CdcTable.open(campaign.folder / "warehouse" / name)
            copied = sorted(table.to_arrow().to_pylist(), key=lambda r: r[key])
            checks[name] = {"rows": len(source), "equal": copied == source,
                            "checksum": _checksum(source), "cdc_checksum": _checksum(copied)}
        cur.execute("SELECT count(*) FROM pgbench_history")
        (history,) = cur.fetchone()
    conn.close()
    writer = EventFileWriter(campaign.folder / "events", "pgbench")
    events = [e for f in writer.committed_files() for e in read_json_events(f)
              if e["object"] == "public.pgbench_history"]
    checks["public.pgbench_history"] = {"rows": history, "events": len(events),
                                        "unique_uuids": len({e["uuid"] for e in events})}
    return checks


def _checksum(rows: list[dict[str, Any]]) -> str:
    return hashlib.md5("\n".join(repr(sorted(r.items())) for r in rows).encode(),
                       usedforsecurity=False).hexdigest()


def pgbench_campaign(campaign: Campaign) -> Campaign:
    """Run the campaign; `campaign.report` says what was checked and found."""
    campaign.folder.mkdir(parents=True, exist_ok=True)
    server = LocalPostgres.start()
    runner = _Runner(campaign, server.password)
    try:
        init = _pgbench(server, "-i", "-q", "-s", str(campaign.scale))
        if init.wait() != 0:
            said = init.stderr.read().decode(errors="replace") if init.stderr else ""
            raise RuntimeError(f"pgbench -i failed: {said}")
        catalog = Catalog(campaign.folder / "catalog.db")
        catalog.create(StreamDefinition.parse({
            "name": "pgbench", "include": ["public.pgbench_*"], "backfill": "all",
            "source": {"kind": "postgres", "dsn": server.dsn(), "password_env": PASSWORD_ENV,
                       "heartbeat_seconds": 2},
            "destinations": [{"kind": "cdc_table", "warehouse": str(campaign.folder /
                                                                    "warehouse")},
                             {"kind": "event_files", "root": str(campaign.folder / "events")}],
            "spark": {"trigger_seconds": 0.5}}))
        catalog.act("pgbench", "start")
        began = time.monotonic()
        runner.start()
        rate = ["-R", str(campaign.rate)] if campaign.rate else []
        workload = _pgbench(server, "-c", str(campaign.clients), "-j", "2", "-T",
                            str(campaign.seconds), *rate)
        _kill_at_points(campaign, runner, catalog, workload)
        _wait(lambda: catalog.get("pgbench").state.value == "RUNNING", 600, "RUNNING")
        catalog.act("pgbench", "drain")
        _wait(lambda: catalog.get("pgbench").state.value == "PAUSED", 1800, "the drain")
        campaign.report = {"seconds": round(time.monotonic() - began, 1),
                           "kills": campaign.killed, "checks": _verify(campaign, server),
                           "errors": [e["message"][:200] for e in catalog.errors("pgbench")],
                           "status": catalog.status("pgbench")}
    finally:
        runner.stop()
        server.stop()
    return campaign
