"""`cdcflow` commands. `cdcflow demo` is the main job on the embedded default database."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sys
import threading
from datetime import timedelta
from pathlib import Path

import click

from cdcflow.cli.streams import discover, streams
from cdcflow.follow import follow_change_stream
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.model.records import ChangeRecord
from cdcflow.store.database import Database
from cdcflow.workload import DEMO_DDL, run_workload


@click.group()
def cli() -> None:
    """cdcflow: change data capture with a PySpark pipeline."""


@cli.command()
@click.option("--duration", default=20.0, show_default=True, help="Seconds of workload.")
@click.option("--rate", default=50.0, show_default=True, help="Transactions per second.")
@click.option("--output", default="demo-output", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print records as JSON lines.")
def demo(duration: float, rate: float, output: str, as_json: bool) -> None:
    """Write a workload into an embedded database and tail its change stream."""
    folder = Path(output)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = str(folder / "shop.db")
    policy = PartitionPolicy(split_records=300, max_partitions=6, merge_min_age_seconds=5.0,
                             merge_max_records_per_second=2.0)
    database = Database.open(path, partition_policy=policy)
    database.ddl(DEMO_DDL)
    database.ddl("CREATE CHANGE STREAM Everything FOR ALL OPTIONS (retention_period = '1d')")
    start = database.partitions("Everything")[0].start_timestamp
    writer = multiprocessing.get_context("spawn").Process(
        target=run_workload, args=(path, duration, rate)
    )
    writer.start()
    lock = threading.Lock()
    counts = {"data": 0, "mods": 0, "heartbeat": 0, "child": 0}

    def show(token: str, row: ChangeRecord) -> None:
        with lock:
            if row.data_change_record is not None:
                record = row.data_change_record
                counts["data"] += 1
                counts["mods"] += len(record.mods)
                if as_json:
                    click.echo(json.dumps({"partition": token, **record.to_dict()}))
                else:
                    keys = ", ".join(json.dumps(m.keys) for m in record.mods)
                    click.echo(f"{record.commit_timestamp:%H:%M:%S.%f} {token[:10]:<10} "
                               f"{record.mod_type:<6} {record.table_name}: {keys} "
                               f"(txn {record.server_transaction_id}, "
                               f"seq {record.record_sequence})")
            elif row.heartbeat_record is not None:
                counts["heartbeat"] += 1
            else:
                counts["child"] += 1
                if not as_json:
                    assert row.child_partitions_record is not None
                    children = [c.token for c in row.child_partitions_record.child_partitions]
                    click.echo(f"-- partition {token[:10]} ended; children {children}")

    end = start + timedelta(seconds=duration + 3)
    follow_change_stream(database, "Everything", start, end, 1000, on_record=show, keep=False)
    writer.join()
    partitions = database.partitions("Everything")
    summary = {
        "records": counts["data"], "mods": counts["mods"], "heartbeats": counts["heartbeat"],
        "partitions": len(partitions),
        "active_partitions": sum(p.state == "ACTIVE" for p in partitions),
        "database": path,
    }
    click.echo(json.dumps(summary) if as_json else f"summary: {summary}", err=as_json)
    if writer.exitcode != 0:
        sys.exit(1)


cli.add_command(streams)
cli.add_command(discover)

if __name__ == "__main__":
    cli()
