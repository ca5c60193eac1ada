"""PostgreSQL as a source: logical decoding with pgoutput into the change log."""
