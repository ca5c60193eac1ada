"""Throwaway local PostgreSQL servers for tests and benchmarks.

`LocalPostgres.start(folder)` runs `initdb` and `pg_ctl` from the Debian packages as an
unprivileged user (as root: the `postgres` user, through `runuser`), on 127.0.0.1 and a free
port, with `wal_level=logical`, and creates a replication user `cdc` with a password and the
database `shop` it owns. Nothing here is used by cdcflow at run time.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cdcflow.errors import FailedPrecondition

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_connections": "200",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_wal_size": "256MB",
    "timezone": "'Pacific/Chatham'",  # an unusual zone: the source must not depend on it
}


def bin_dir() -> Path:
    """The folder with the PostgreSQL server programs (the newest version installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]))
    if not found:
        raise FailedPrecondition("PostgreSQL is not installed: apt-get install postgresql "
                                 "postgresql-contrib (make test does)")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class LocalPostgres:
    """A running server: `dsn(database, user)` connects; `stop()` ends it."""

    folder: Path
    port: int
    password: str
    owner: str | None

    @classmethod
    def start(cls, folder: Path | None = None) -> LocalPostgres:
        """Start a server in `folder` (default: a new folder under the system's temporary
        folder, which the server's user can reach)."""
        folder = folder or Path(tempfile.mkdtemp(prefix="cdcflow-pg-"))
        folder.mkdir(parents=True, exist_ok=True)
        owner = "postgres" if os.geteuid() == 0 else None
        if owner is not None:
            account = pwd.getpwnam(owner)
            os.chown(folder, account.pw_uid, account.pw_gid)
        server = cls(folder, free_port(), secrets.token_hex(12), owner)
        server._initdb()
        server._run(str(bin_dir() / "pg_ctl"), "-D", str(folder / "data"), "-l",
                    str(folder / "server.log"), "-w", "-t", "60", "start")
        server.sql("postgres", f"CREATE ROLE cdc LOGIN REPLICATION PASSWORD "
                               f"'{server.password}'")
        server.sql("postgres", "CREATE DATABASE shop OWNER cdc")
        return server

    def _run(self, *command: str) -> str:
        prefix = ["runuser", "-u", self.owner, "--"] if self.owner else []
        result = subprocess.run([*prefix, *command], capture_output=True, text=True,
                                timeout=120, check=False, cwd=self.folder)
        if result.returncode != 0:
            raise FailedPrecondition(f"{command[0]} failed: {result.stderr[-2000:]}")
        return result.stdout

    def _initdb(self) -> None:
        data = self.folder / "data"
        self._run(str(bin_dir() / "initdb"), "-D", str(data), "-U", "postgres",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                  "--locale=C.UTF-8")
        settings = SETTINGS | {"port": str(self.port),
                               "unix_socket_directories": f"'{self.folder}'"}
        lines = "".join(f"{k} = {v}\n" for k, v in settings.items())
        self._run("sh", "-c", f"printf '%s' \"$0\" >> {data}/postgresql.conf", lines)
        hba = ("local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
               "host all all 127.0.0.1/32 scram-sha-256\n"
               "host replication all 127.0.0.1/32 scram-sha-256\n")
        self._run("sh", "-c", f"printf '%s' \"$0\" > {data}/pg_hba.conf", hba)

    def dsn(self, database: str = "shop", user: str = "cdc") -> str:
        """libpq keywords without the password (it comes from the environment)."""
        return f"host=127.0.0.1 port={self.port} dbname={database} user={user}"

    def sql(self, database: str, statement: str) -> str:
        """Run SQL as the superuser through psql; return its unaligned output."""
        return self._run(str(bin_dir() / "psql"), "-X", "-q", "-A", "-t", "-v",
                         "ON_ERROR_STOP=1", "-h", str(self.folder), "-p", str(self.port),
                         "-U", "postgres", "-d", database, "-c", statement)

    def restart(self, mode: str = "fast") -> None:
        """Restart the server; `mode` is pg_ctl's: smart, fast, or immediate (a crash)."""
        self._run(str(bin_dir() / "pg_ctl"), "-D", str(self.folder / "data"), "-l",
                  str(self.folder / "server.log"), "-m", mode, "-w", "-t", "60", "restart")

    def stop(self) -> None:
        try:
            self._run(str(bin_dir() / "pg_ctl"), "-D", str(self.folder / "data"), "-m",
                      "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
