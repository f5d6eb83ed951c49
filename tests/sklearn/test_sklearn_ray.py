"""SklearnTrainer on the Ray engine: one actor holding trainer_resources, joblib on Ray's
backend (as AIR's SklearnTrainer), so cross-validation folds run in Ray's processes."""

from __future__ import annotations

import os

import pytest
from sklearn_models import regression

pytest.importorskip("ray")

import phalanx
from phalanx.sklearn import SklearnPredictor, SklearnTrainer

pytestmark = pytest.mark.slow


def test_folds_run_on_rays_joblib_backend(local_ray, tmp_path):
    from sklearn.linear_model import Ridge

    df = regression(300)
    log = tmp_path / "pids.txt"

    def r2_logging_pid(estimator, features, label):  # a local function: pickled by value
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return estimator.score(features, label)

    result = SklearnTrainer(
        Ridge(),
        label_column="y",
        cv=3,
        scoring=r2_logging_pid,
        datasets={"train": df.iloc[:250], "valid": df.iloc[250:]},
        scaling_config=phalanx.ScalingConfig(trainer_resources={"CPU": 2}, engine="ray"),
        run_config=phalanx.RunConfig(storage_path=str(tmp_path / "runs")),
    ).fit()
    valid, *folds = log.read_text().split()  # the actor scores "valid" first, then the folds
    assert len(folds) == 3 and valid not in folds
    assert result.metrics["valid"]["test_score"] > 0.9
    assert len(result.metrics["cv"]["test_score"]) == 3
    predictions = SklearnPredictor.from_checkpoint(result.checkpoint).predict(
        df.iloc[250:].drop(columns="y")
    )
    assert len(predictions) == 50
