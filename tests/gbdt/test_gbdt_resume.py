"""Re-running a finished XGBoost / LightGBM run returns the finished model and its metrics, and
commits nothing (it used to commit an empty-metrics checkpoint and crash the script)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gbdt_data import make_classification

from phalanx import CheckpointConfig, RunConfig, ScalingConfig

pytestmark = pytest.mark.slow

# imported now, not in a test: importing them sets environment variables (no_leaks)
xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def builtin_trainer(library, storage):
    df = make_classification(2_000)
    datasets = {"train": df.iloc[:1_600], "valid": df.iloc[1_600:]}
    if library == "xgboost":
        from phalanx.xgboost import XGBoostTrainer as Trainer

        params = {"objective": "binary:logistic", "eval_metric": "logloss"}
    else:
        from phalanx.lightgbm import LightGBMTrainer as Trainer

        params = {"objective": "binary", "metric": "binary_logloss"}
    return Trainer(
        datasets=datasets,
        label_column="y",
        params=params,
        num_boost_round=6,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=f"{library}-run",
            storage_path=storage,
            checkpoint_config=CheckpointConfig(checkpoint_frequency=4),
        ),
    )


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_finished_builtin_run_rerun_returns_the_model_and_commits_nothing(library, tmp_path):
    storage = str(tmp_path / "runs")
    first = builtin_trainer(library, storage).fit()
    run_dir = os.listdir(first.path)
    again = builtin_trainer(library, storage).fit()
    assert again.metrics == first.metrics and again.metrics  # the last round's metrics
    assert again.checkpoint == first.checkpoint
    assert sorted(os.listdir(first.path)) == sorted(run_dir)  # no new checkpoint
    assert len(again.metrics_dataframe) == len(first.metrics_dataframe) == 6


def test_rerunning_the_xgboost_example_works(tmp_path):
    command = [
        sys.executable,
        os.path.join(ROOT, "examples", "xgboost_tabular.py"),
        "--rows",
        "3000",
        "--rounds",
        "10",
        "--storage-path",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    for run in range(2):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, f"run {run}:\n{done.stderr[-3000:]}"
        assert "valid-logloss" in done.stdout
    assert "Resuming run 'xgboost-builtin' from checkpoint_000009" in done.stderr
