"""Ray Train V2 API pieces on the Ray engine: collectives, worker_runtime_env, label_selector,
and Tune sweeps whose trials' runs use the Ray engine (concurrency follows the Ray cluster's
resources, not this machine's cores; in this module for its Ray instance: tests/tune has none)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig, tune
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


WAIT_S = 60.0  # for the other trial's run: only a broken sweep waits this long


def meet_the_other_trial(config):
    # each trial's rank 0 says it runs, then waits for the other trial's run to run too
    scratch = Path(config["scratch"])
    if train.get_context().get_world_rank() == 0:
        (scratch / f"running_{config['x']}").touch()
    deadline = time.monotonic() + WAIT_S
    while len(list(scratch.glob("running_*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the other run's file (a condition, with a deadline)
    train.report({"loss": float(config["x"]), "met": len(list(scratch.glob("running_*")))})


def sweep_driver(config):
    DataParallelTrainer(
        meet_the_other_trial,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(verbose=0),
    ).fit()


def test_trials_on_the_ray_engine_run_side_by_side_as_the_clusters_cpus_allow(local_ray, tmp_path):
    # the cluster has 4 CPUs, this machine 2 cores: two 2-worker trials fit the cluster at once
    assert local_ray.cluster_resources()["CPU"] == 4
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    grid = tune.Tuner(
        sweep_driver,
        param_space={"x": tune.grid_search([1, 2]), "scratch": str(scratch)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert not grid.errors and len(grid) == 2
    assert [r.metrics["met"] for r in grid] == [2, 2]  # each run ran while the other did
