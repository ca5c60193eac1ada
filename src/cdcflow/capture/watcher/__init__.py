"""The polling change watcher (seed 001, CW-1..8)."""
