"""A sweep whose trials' Train runs store on S3 (a real moto server): the runs and their
checkpoints go to the bucket, each trial's latest checkpoint is the one on S3 (read back through
the run's filesystem), the sweep's own state stays in its local directory."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from _helpers.s3 import moto_s3

import phalanx
from phalanx import tune
from phalanx.checkpoint import Checkpoint
from phalanx.config import RunConfig, ScalingConfig
from phalanx.trainer import DataParallelTrainer


def loop(config):
    for step in range(3):
        path = tempfile.mkdtemp()
        with open(os.path.join(path, "step"), "w") as f:
            f.write(str(step))
        loss = (config["x"] - 2) ** 2 + 1 / (step + 1)
        phalanx.report({"loss": loss}, checkpoint=Checkpoint(path))


@pytest.mark.slow
def test_trials_train_runs_store_on_s3_and_their_checkpoints_are_read_from_there(tmp_path):
    with moto_s3("sweeps") as fs:

        def driver(config):
            DataParallelTrainer(
                loop,
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=1),
                run_config=RunConfig(
                    storage_path="s3://sweeps/runs", storage_filesystem=fs, verbose=0
                ),
            ).fit()

        grid = tune.Tuner(
            driver,
            param_space={"x": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(name="s", storage_path=str(tmp_path)),
        ).fit()
        assert not grid.errors and len(grid) == 2
        best = grid.get_best_result()
        assert best.config == {"x": 2} and best.metrics["loss"] == pytest.approx(1 / 3)
        for result in grid:
            checkpoint = result.checkpoint
            assert checkpoint is not None and "s3://sweeps/runs/" in repr(checkpoint)
            with open(os.path.join(checkpoint.to_directory(), "step")) as f:
                assert f.read() == "2"
        runs = {p.split("/")[2] for p in fs.find("sweeps/runs")}
        assert len(runs) == 2  # one run directory per trial, in the bucket
        state = json.loads((tmp_path / "s" / "tuner_state.json").read_text())
        assert [t["status"] for t in state["trials"]] == ["TERMINATED", "TERMINATED"]
