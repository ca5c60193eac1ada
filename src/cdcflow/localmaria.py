"""Throwaway local MariaDB servers for tests and benchmarks.

`LocalMariaDB.start(folder)` runs `mariadb-install-db` and `mariadbd` from the Debian
packages as an unprivileged user (as root: the `mysql` user, through `runuser`), on
127.0.0.1 and a free port, with a row-based binlog (`binlog_format=ROW`,
`binlog_row_image=FULL`, `binlog_row_metadata=FULL`), and creates a user `cdc` with a
password, the replication privileges and the database `shop`. `settings` overrides the
server's options, to start one that lacks what a CDC reader needs. Nothing here is used by
cdcflow at run time.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition
from cdcflow.localdb import free_port

SERVER = "/usr/sbin/mariadbd"
INSTALL = "/usr/bin/mariadb-install-db"
SETTINGS = {
    "server-id": "1",
    "log-bin": "mariadb-bin",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_general_ci",
    "innodb-buffer-pool-size": "64M",
    "innodb-flush-log-at-trx-commit": "2",
    "sync-binlog": "0",
    "max-connections": "200",
    "default-time-zone": "+12:45",  # an unusual zone: the source must not depend on it
}


def installed() -> bool:
    return os.path.exists(SERVER) and os.path.exists(INSTALL)


@dataclass
class LocalMariaDB:
    """A running server: `connect(user)` opens a PyMySQL connection; `stop()` ends it."""

    folder: Path
    port: int
    password: str
    owner: str | None
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, folder: Path | None = None,
              settings: dict[str, str | None] | None = None) -> LocalMariaDB:
        """Start a server in `folder` (default: a new folder under the system's temporary
        folder); `settings` are laid over SETTINGS (None removes one)."""
        if not installed():
            raise FailedPrecondition("MariaDB is not installed: apt-get install mariadb-server "
                                     "(make test does)")
        folder = folder or Path(tempfile.mkdtemp(prefix="cdcflow-maria-"))
        folder.mkdir(parents=True, exist_ok=True)
        owner = "mysql" if os.geteuid() == 0 else None
        if owner is not None:
            account = pwd.getpwnam(owner)
            os.chown(folder, account.pw_uid, account.pw_gid)
        server = cls(folder, free_port(), secrets.token_hex(12), owner)
        server._install()
        server._launch({k: v for k, v in (SETTINGS | (settings or {})).items()
                        if v is not None})
        server._create_users()
        return server

    def _prefix(self) -> list[str]:
        return ["runuser", "-u", self.owner, "--"] if self.owner else []

    def _install(self) -> None:
        result = subprocess.run(
            [*self._prefix(), INSTALL, "--no-defaults", f"--datadir={self.folder / 'data'}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             "--skip-name-resolve", "--force"],
            capture_output=True, text=True, timeout=180, check=False, cwd=self.folder)
        if result.returncode != 0:
            raise FailedPrecondition(f"mariadb-install-db failed: {result.stderr[-2000:]}")

    def _launch(self, settings: dict[str, str]) -> None:
        options = [f"--{name}={value}" for name, value in settings.items()]
        self.process = subprocess.Popen(
            [*self._prefix(), SERVER, "--no-defaults", f"--datadir={self.folder / 'data'}",
             f"--socket={self.folder / 'server.sock'}", f"--pid-file={self.folder / 'pid'}",
             f"--log-error={self.folder / 'server.log'}", "--bind-address=127.0.0.1",
             f"--port={self.port}", "--skip-name-resolve", *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.folder)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.connect("root", password="").close()
                return
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = (self.folder / "server.log")
                    text = log.read_text()[-2000:] if log.exists() else ""
                    raise FailedPrecondition(f"mariadbd did not start: {text}") from None
                time.sleep(0.05)

    def _create_users(self) -> None:
        self.sql(f"CREATE USER 'cdc'@'127.0.0.1' IDENTIFIED BY '{self.password}'",
                 "GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT, RELOAD ON *.* "
                 "TO 'cdc'@'127.0.0.1'",
                 "CREATE DATABASE shop", "GRANT ALL ON shop.* TO 'cdc'@'127.0.0.1'")

    def connect(self, user: str = "cdc", password: str | None = None,
                database: str | None = None) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user=user,
                               password=self.password if password is None else password,
                               database=database, autocommit=True, charset="utf8mb4")

    def sql(self, *statements: str, database: str | None = None) -> list[tuple[Any, ...]]:
        """Run statements as root; return the last one's rows."""
        conn = self.connect("root", password="", database=database)
        try:
            rows: list[tuple[Any, ...]] = []
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
                    rows = list(cursor.fetchall())
            return rows
        finally:
            conn.close()

    def stop(self) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(60)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(30)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
