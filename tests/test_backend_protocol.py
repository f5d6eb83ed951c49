"""A third-party Backend written against the public ``phalanx.backend.WorkerGroup`` protocol
sees where each rank runs and reaches every rank, on threads and on worker processes."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import pytest

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.backend import Backend, BackendConfig, WorkerGroup

pytestmark = pytest.mark.slow

SEEN: list[dict[str, Any]] = []


def _pid_and_value(value: int) -> tuple[int, int]:
    return os.getpid(), value


class _RecordingBackend(Backend):
    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        n = len(worker_group)
        SEEN.append(
            {
                "len": n,
                "process_per_worker": worker_group.process_per_worker,
                "num_workers": worker_group.scaling_config.num_workers,
                "resources": worker_group.get_resources_per_worker(),
                "workers": [
                    (w.world_rank, w.local_rank, w.node_rank, w.local_world_size)
                    for w in worker_group.workers
                ],
                "where": [(w.host, w.node_id, w.pid, w.gpu_ids) for w in worker_group.workers],
                "per_rank": worker_group.execute_per_rank(_pid_and_value, [(r,) for r in range(n)]),
                "single": worker_group.execute_single_async(n - 1, _pid_and_value, 7).result(30),
                "every": worker_group.execute(os.getpid),
            }
        )


@dataclass
class _RecordingConfig(BackendConfig):
    @property
    def backend_cls(self) -> type[Backend]:
        return _RecordingBackend


@pytest.mark.parametrize("engine", ["thread", "local"])
def test_a_backend_typed_with_the_protocol_sees_every_rank(engine, storage):
    SEEN.clear()
    DataParallelTrainer(
        lambda: train.report({"ok": 1}),
        backend_config=_RecordingConfig(),
        scaling_config=ScalingConfig(num_workers=2, engine=engine),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    (seen,) = SEEN
    assert seen["len"] == 2 and seen["num_workers"] == 2
    assert seen["resources"] == {"CPU": 1}
    assert seen["workers"] == [(0, 0, 0, 2), (1, 1, 0, 2)]  # one node: torchrun's numbering
    pids = [pid for _, _, pid, _ in seen["where"]]
    assert [host for host, _, _, _ in seen["where"]] == [socket.gethostname()] * 2
    assert {node for _, node, _, _ in seen["where"]} == {"local"}
    assert [gpus for _, _, _, gpus in seen["where"]] == [(), ()]
    assert seen["per_rank"] == [(pids[0], 0), (pids[1], 1)]  # each call ran on its own rank
    assert seen["single"] == (pids[1], 7)
    assert seen["every"] == pids
    # Threads share the driver's process: a backend that keeps per-process state refuses them.
    assert seen["process_per_worker"] is (engine == "local")
    assert (len(set(pids)) == 2 and os.getpid() not in pids) is (engine == "local")
