"""The fault campaign's command runner (issue 14): a mount that is busy for a while (a writer
holds a file open through it) is tried again until it succeeds, any other failure is raised
at once, and a busy one past its deadline is raised too."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.faultkit_rig import run_command

pytestmark = pytest.mark.unit

BUSY_TWICE = ('n=$(cat "$0" 2>/dev/null || echo 0); echo $((n+1)) > "$0"; '
              '[ "$n" -ge 2 ] || { echo "mount point is busy." >&2; exit 32; }')


def test_a_command_busy_for_a_while_is_run_again_until_it_succeeds(tmp_path: Path):
    count = tmp_path / "runs"
    run_command("sh", "-c", BUSY_TWICE, str(count), busy_seconds=30)
    assert count.read_text().strip() == "3"


def test_a_busy_command_fails_at_once_without_a_grace_period(tmp_path: Path):
    count = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="mount point is busy"):
        run_command("sh", "-c", BUSY_TWICE, str(count))
    assert count.read_text().strip() == "1"


def test_any_other_failure_is_raised_at_once(tmp_path: Path):
    with pytest.raises(RuntimeError, match="permission denied"):
        run_command("sh", "-c", 'echo "permission denied" >&2; exit 1', busy_seconds=30)
