"""The tests' MariaDB: a real server on 127.0.0.1 and a free port, run by an unprivileged
user, with the row-based binlog a CDC reader needs (issue 12)."""

from __future__ import annotations

import os
import pwd

import pytest

from cdcflow.localmaria import LocalMariaDB

pytestmark = pytest.mark.integration


def test_the_server_runs_unprivileged_with_a_row_binlog(maria: LocalMariaDB):
    (user,) = maria.sql("SELECT USER()")[0]
    assert user.startswith("root@")
    variables = dict(maria.sql(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
        "'binlog_row_image', 'binlog_row_metadata', 'port', 'bind_address')"))
    assert variables == {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                         "binlog_row_metadata": "FULL", "port": str(maria.port),
                         "bind_address": "127.0.0.1"}
    pid = int((maria.folder / "pid").read_text())
    with open(f"/proc/{pid}/status") as status:
        uid = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    assert uid != 0 and pwd.getpwuid(uid).pw_name == (maria.owner or pwd.getpwuid(
        os.geteuid()).pw_name)


def test_the_cdc_user_has_replication_rights_and_the_shop_database(maria: LocalMariaDB):
    conn = maria.connect("cdc", database="shop")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW BINARY LOGS")
            assert cursor.fetchall()
            cursor.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            cursor.execute("SHOW GRANTS")
            grants = " ".join(row[0] for row in cursor.fetchall())
        assert "REPLICATION SLAVE" in grants and "BINLOG MONITOR" in grants
    finally:
        conn.close()
