"""At the end of each attempt every tracker gets the goodput breakdown so far: TensorBoard and
MLflow as ``goodput/...`` series stepped by the attempt, W&B in the run's summary."""

from __future__ import annotations

import json
import os

import pytest
from tracker_files import (
    import_tensorboard_reader,
    tensorboard_scalars,
    wandb_finished_records,
    wandb_offline_runs,
)

import phalanx as train
from phalanx import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.integrations import MLflowLoggerCallback, TBXLoggerCallback, WandbLoggerCallback

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboardX")
import_tensorboard_reader()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]


def fails_once(config):
    for step in range(3):
        train.report({"step": step})
    if train.get_context().get_attempt() == 0:
        raise RuntimeError("failing once")


def test_each_attempt_sends_the_goodput_parts_to_every_tracker(
    storage, tmp_path, tracking_uri, wandb_service, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    result = DataParallelTrainer(
        fails_once,
        scaling_config=ScalingConfig(num_workers=1, engine="local"),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
            callbacks=[
                TBXLoggerCallback(),
                MLflowLoggerCallback(tracking_uri, experiment_name="goodput"),
                WandbLoggerCallback(project="goodput", mode="offline"),
            ],
        ),
    ).fit()
    final = result.goodput
    run = os.path.join(storage, "run")

    scalars = tensorboard_scalars(os.path.join(run, "tensorboard"))
    assert [step for step, _ in scalars["goodput/failures_s"]] == [1, 2]  # one per attempt
    first_failures, last_failures = (v for _, v in scalars["goodput/failures_s"])
    assert first_failures > 0.0
    assert last_failures == pytest.approx(final.seconds["failures"], rel=1e-5)
    assert scalars["goodput/fraction"][-1][1] == pytest.approx(final.goodput, rel=1e-5)

    client = mlflow.tracking.MlflowClient(tracking_uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("goodput").experiment_id])
    history = client.get_metric_history(mlrun.info.run_id, "goodput/productive_s")
    assert [m.step for m in history] == [1, 2]
    assert history[-1].value == pytest.approx(final.seconds["productive"])

    (wandb_run,) = wandb_offline_runs(run)
    summary = {}
    for record in wandb_finished_records(wandb_run):
        if record.WhichOneof("record_type") == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in record.summary.update})
    assert summary["goodput/wall_s"] == pytest.approx(final.wall_s)
    assert summary["goodput/fraction"] == pytest.approx(final.goodput)
