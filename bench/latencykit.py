"""What the latency benchmarks share: when each probe row showed in the CDC table, in a
committed event file, and in the change log. The probe is a one-column table `id`."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from cdcflow.events.files import read_json_events
from cdcflow.store.log import LOG_DATA
from cdcflow.table import CdcTable
from pgkit import wait_until

POLL_PAUSE = 0.05  # seconds between polls: the resolution is this plus one poll


class Seen:
    """When each probe row first showed in the CDC table and in a committed event file."""

    def __init__(self, folder: Path, committed: dict[int, float], probe: str) -> None:
        self.folder, self.committed, self.probe = folder, committed, probe
        self.table: dict[int, float] = {}
        self.events: dict[int, float] = {}
        self.manifests: set[Path] = set()
        self.polls: list[float] = []

    def poll_table(self, table: CdcTable) -> None:
        began = time.time()
        pending = [(n,) for n in list(self.committed) if n not in self.table]
        if pending:
            for key in table.lookup(pending):
                self.table.setdefault(int(key[0]), time.time())
        self.polls.append(time.time() - began)

    def poll_events(self) -> None:
        stream = self.folder / "events" / "latency"
        for manifest in sorted(set((stream / "_manifests").glob("batch-*.json"))
                               - self.manifests):
            self.manifests.add(manifest)
            for entry in json.loads(manifest.read_text())["files"]:
                if self.probe in entry["path"]:
                    for event in read_json_events(stream / entry["path"]):
                        self.events.setdefault(int(event["payload"]["id"]), time.time())

    def poll(self, stop: threading.Event) -> None:
        root = self.folder / "warehouse" / self.probe
        table = wait_until(lambda: root.exists() and CdcTable.open(root), 300,
                           "the probe's CDC table")
        while not stop.is_set():
            self.poll_table(table)
            self.poll_events()
            time.sleep(POLL_PAUSE)  # a pause, so the poller leaves the cores to the pipeline

    def has_all(self) -> bool:
        return all(n in self.table and n in self.events for n in list(self.committed))


def logged_at(log_path: Path, probe: str) -> dict[int, float]:
    """When each probe row was appended to the change log (the log's commit time)."""
    found: dict[int, float] = {}
    with sqlite3.connect(f"file:{log_path}?mode=ro", uri=True) as conn:
        for micros, body in conn.execute("SELECT commit_micros, body FROM _log WHERE kind = ?",
                                         (LOG_DATA,)):
            record = json.loads(body)
            if record["table_name"] == probe:
                for mod in record["mods"]:
                    found[int(mod["keys"]["id"])] = micros / 1e6
    return found
