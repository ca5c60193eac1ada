"""MySQL and MariaDB as a source: the row-based binlog through mysql-replication."""
