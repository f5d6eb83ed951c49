"""Ray Train V2 API pieces on the Ray engine: collectives, worker_runtime_env, label_selector."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.collective import barrier, broadcast_from_rank_zero

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def test_collectives_on_ray_actors(storage):
    def train_func():
        rank = train.get_context().get_world_rank()
        token = broadcast_from_rank_zero(f"from-{os.getpid()}" if rank == 0 else None)
        barrier()
        train.report({"token": token, "pid": os.getpid()})

    result = DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage, name="collectives"),
    ).fit()
    rows = result.all_ranks_metrics_dataframe
    rank0_pid = int(rows[rows["rank"] == 0]["pid"].iloc[0])
    assert set(rows["token"]) == {f"from-{rank0_pid}"}


def test_worker_runtime_env_reaches_the_actors(storage):
    def train_func():
        train.report({"flag": os.environ.get("RUNTIME_FLAG")})

    result = DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=storage,
            name="runtime_env",
            worker_runtime_env={"env_vars": {"RUNTIME_FLAG": "set-by-ray"}},
        ),
    ).fit()
    assert set(result.all_ranks_metrics_dataframe["flag"]) == {"set-by-ray"}


def test_label_selector_places_workers_on_the_selected_node(storage):
    import ray

    node_id = ray.get_runtime_context().get_node_id()

    def train_func():
        train.report({"node": ray.get_runtime_context().get_node_id()})

    result = DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2, label_selector={"ray.io/node-id": node_id}),
        run_config=RunConfig(storage_path=storage, name="labels"),
    ).fit()
    assert set(result.all_ranks_metrics_dataframe["node"]) == {node_id}
