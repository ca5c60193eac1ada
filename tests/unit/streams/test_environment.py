"""Failures the machine causes (issue 14): recognised from an OSError or from its text in a
Spark query's failure, and said plainly with the place."""

from __future__ import annotations

import errno

from cdcflow.streams.failures import environmental


def test_a_full_disk_a_read_only_folder_and_a_refusal_are_named_with_the_place():
    full = OSError(errno.ENOSPC, "No space left on device", "/w/Accounts/x.parquet")
    assert environmental(full).startswith("the disk is full at /w/Accounts/x.parquet")
    spark = RuntimeError("the streaming query failed: ... OSError: [Errno 30] Read-only file "
                         "system: '/events/s/_manifests/batch-1.json.tmp'\n  at ...")
    assert environmental(spark).startswith(
        "the file system is read-only at /events/s/_manifests/batch-1.json.tmp")
    assert environmental(RuntimeError("Generic DeltaError: No space left on device (os "
                                      "error 28)")).startswith("the disk is full")
    assert environmental(PermissionError(errno.EACCES, "Permission denied", "/w")) \
        .startswith("permission is denied at /w")


def test_other_failures_are_not_the_machine():
    assert environmental(RuntimeError("the streaming query failed: KeyError: 'Id'")) is None
    assert environmental(OSError(errno.ENOENT, "No such file or directory", "/x")) is None
