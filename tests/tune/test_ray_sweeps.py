"""Sweeps whose trials' Train runs use the Ray engine: concurrency follows the Ray cluster's
resources, not this machine's cores."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import phalanx
from phalanx import tune
from phalanx.config import RunConfig, ScalingConfig
from phalanx.trainer import DataParallelTrainer

WAIT_S = 60.0  # for the other trial's run: only a broken sweep waits this long


def meet_the_other_trial(config):
    # each trial's rank 0 says it runs, then waits for the other trial's run to run too
    scratch = Path(config["scratch"])
    if phalanx.get_context().get_world_rank() == 0:
        (scratch / f"running_{config['x']}").touch()
    deadline = time.monotonic() + WAIT_S
    while len(list(scratch.glob("running_*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the other run's file (a condition, with a deadline)
    phalanx.report({"loss": float(config["x"]), "met": len(list(scratch.glob("running_*")))})


def driver(config):
    DataParallelTrainer(
        meet_the_other_trial,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(verbose=0),
    ).fit()


@pytest.mark.slow
def test_trials_on_the_ray_engine_run_side_by_side_as_the_clusters_cpus_allow(local_ray, tmp_path):
    # the cluster has 4 CPUs, this machine 2 cores: two 2-worker trials fit the cluster at once
    assert local_ray.cluster_resources()["CPU"] == 4
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    grid = tune.Tuner(
        driver,
        param_space={"x": tune.grid_search([1, 2]), "scratch": str(scratch)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert not grid.errors and len(grid) == 2
    assert [r.metrics["met"] for r in grid] == [2, 2]  # each run ran while the other did
