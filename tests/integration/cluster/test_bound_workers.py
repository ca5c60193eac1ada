"""Workers bound to CPUs of their own (`standalone_cluster(pinned=True)`), which bench_cluster
uses so that a worker of one core uses one CPU, as on a machine of its own (issue 15)."""

from __future__ import annotations

import os
from pathlib import Path

from cdcflow.localcluster import cpu_binding, standalone_cluster


def test_workers_take_the_usable_cpus_in_turn() -> None:
    assert cpu_binding(0, 1, [1, 0]) == ["taskset", "--cpu-list", "0"]
    assert cpu_binding(1, 1, [0, 1]) == ["taskset", "--cpu-list", "1"]
    assert cpu_binding(2, 1, [0, 1]) == ["taskset", "--cpu-list", "0"]  # wraps round
    assert cpu_binding(1, 2, [2, 5, 7]) == ["taskset", "--cpu-list", "2,7"]
    assert cpu_binding(0, 3, [4]) == ["taskset", "--cpu-list", "4"]  # one CPU, said once


def test_a_bound_worker_and_what_it_starts_run_on_its_cpus_only(tmp_path: Path) -> None:
    usable = sorted(os.sched_getaffinity(0))
    with standalone_cluster(tmp_path / "cluster", 2, pinned=True) as cluster:
        for index, worker in enumerate(cluster.workers):
            wanted = {int(cpu) for cpu in cpu_binding(index, 1, usable)[-1].split(",")}
            assert os.sched_getaffinity(worker.pid) == wanted  # taskset, unshare, sh exec
    with standalone_cluster(tmp_path / "unbound", 1) as cluster:
        assert os.sched_getaffinity(cluster.workers[0].pid) == set(usable)
