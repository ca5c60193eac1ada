"""The `cdcflow` command line."""
