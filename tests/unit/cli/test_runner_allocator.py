"""The runner's Arrow allocator (issue 11 goal 6): the system one, unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import os, pyarrow as pa; from cdcflow.cli.run import use_system_allocator; "
         "use_system_allocator(); print(pa.default_memory_pool().backend_name, "
         "os.environ['ARROW_DEFAULT_MEMORY_POOL'])")


def probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    result = subprocess.run([sys.executable, "-c", PROBE], env=clean | env, text=True,
                            capture_output=True, timeout=60, check=True)
    return result.stdout.strip()


def test_the_runner_takes_the_system_allocator_and_sets_the_variable_workers_inherit():
    assert probe() == "system system"


def test_an_allocator_the_user_named_is_kept():
    assert probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc mimalloc"
