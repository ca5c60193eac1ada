"""Pure data and rules: column types, schemas, records, partitions. No I/O."""
