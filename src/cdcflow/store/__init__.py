"""The embedded change-stream database on SQLite (WAL): DDL, transactions, partitions, reads."""
