"""`cdcflow` commands: demo (the main job), run (the runner), streams, discover, watcher, verify,
prepare (a faster Spark start)."""

from __future__ import annotations

import click

from cdcflow.cli.demo import demo
from cdcflow.cli.prepare import prepare
from cdcflow.cli.run import run
from cdcflow.cli.streams import discover, streams
from cdcflow.cli.verify import verify
from cdcflow.cli.watcher import watcher


@click.group()
def cli() -> None:
    """cdcflow: change data capture with a PySpark pipeline."""


cli.add_command(demo)
cli.add_command(run)
cli.add_command(streams)
cli.add_command(discover)
cli.add_command(watcher)
cli.add_command(verify)
cli.add_command(prepare)

if __name__ == "__main__":
    cli()
