"""A failure, a retry and a resume on real worker processes: every tracker sees each step once.

The retry restarts from the latest checkpoint, so it re-runs epochs the failed attempt had already
reported; the resumed fit() continues the run directory. Trackers log against the run-wide step,
so none of them ever sees a step twice (W&B would drop a row whose step went backwards, and
TensorBoard would draw the curve back over itself). At the end of each attempt every tracker
gets the goodput breakdown so far: TensorBoard and MLflow as ``goodput/...`` series stepped by
the attempt, W&B in the run's summary (here: the module's MLflow store is made once).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest
from tracker_files import (
    csv_rows,
    import_tensorboard_reader,
    json_rows,
    tensorboard_scalars,
    wandb_finished_records,
    wandb_history,
    wandb_offline_runs,
)

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.integrations import (
    CSVLoggerCallback,
    JsonLoggerCallback,
    MLflowLoggerCallback,
    TBXLoggerCallback,
    WandbLoggerCallback,
)

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboardX")
import_tensorboard_reader()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]


def _wait_for(path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


def flaky(config):
    """Checkpoints at epochs 0 and 4; rank 0 fails once, after both ranks reported epoch 3."""
    rank = train.get_context().get_world_rank()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "epoch")) as f:
            start = int(f.read()) + 1
    for epoch in range(start, config["epochs"]):
        saved = None
        if epoch % 4 == 0:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "epoch"), "w") as f:
                f.write(str(epoch))
            saved = Checkpoint.from_directory(d)
        train.report({"loss": 1.0 / (epoch + 1), "epoch": epoch}, checkpoint=saved)
        failed_once = os.path.join(config["dir"], "failed")
        if epoch == 3 and not os.path.exists(failed_once):
            if rank == 1:
                open(os.path.join(config["dir"], "rank1_at_3"), "w").close()
            else:
                _wait_for(os.path.join(config["dir"], "rank1_at_3"))
                open(failed_once, "w").close()
                raise RuntimeError("failing once after epoch 3")


def trackers(tracking_uri):
    return [
        CSVLoggerCallback(),
        JsonLoggerCallback(),
        TBXLoggerCallback(),
        MLflowLoggerCallback(tracking_uri, experiment_name="retry"),
        WandbLoggerCallback(project="retry", mode="offline"),
    ]


def fit(storage, tmp_path, tracking_uri, epochs):
    return DataParallelTrainer(
        flaky,
        train_loop_config={"epochs": epochs, "dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2, engine="local"),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
            callbacks=trackers(tracking_uri),
        ),
    ).fit()


def test_steps_never_repeat_across_a_retry_and_a_resume(
    storage, tmp_path, tracking_uri, wandb_service, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    fit(storage, tmp_path, tracking_uri, epochs=6)  # fails once, retried from epoch 0's checkpoint
    fit(storage, tmp_path, tracking_uri, epochs=8)  # resumed from epoch 4's checkpoint
    run = os.path.join(storage, "run")

    rows = json_rows(os.path.join(run, "result.json"))
    steps = [r["step"] for r in rows]
    epochs = [r["epoch"] for r in rows]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        committed = sum(1 for line in f if line.strip())
    assert steps == list(range(1, committed + 1))
    assert {r["attempt"] for r in rows} == {0, 1}
    assert epochs[-2:] == [6, 7]
    rerun = [i for i in range(1, len(epochs)) if epochs[i] <= epochs[i - 1]]
    assert rerun, f"the retry re-ran no epoch the trackers had seen: {epochs}"

    expected = list(zip(steps, epochs, strict=True))
    csv = csv_rows(os.path.join(run, "progress.csv"))
    assert [(int(r["step"]), int(r["epoch"])) for r in csv] == expected

    scalars = tensorboard_scalars(os.path.join(run, "tensorboard"))
    assert [(s, int(v)) for s, v in scalars["epoch"]] == expected

    client = mlflow.tracking.MlflowClient(tracking_uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("retry").experiment_id])
    history = client.get_metric_history(mlrun.info.run_id, "epoch")
    assert [(m.step, int(m.value)) for m in history] == expected
    assert mlrun.info.status == "FINISHED"

    runs = [wandb_history(d) for d in wandb_offline_runs(run)]  # one W&B run per fit()
    assert len(runs) == 2  # steps continue from the first to the second
    ordered = sorted(runs, key=lambda history: history[0]["_step"])
    logged = [(h["_step"], h["epoch"]) for history in ordered for h in history]
    assert logged == expected

    with open(os.path.join(run, "params.json")) as f:
        assert json.load(f)["epochs"] == 6  # written by the first fit, kept


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
