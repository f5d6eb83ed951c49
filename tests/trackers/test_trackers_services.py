"""MLflow (a local SQLite tracking store) and Weights & Biases (offline) on real runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
from tracker_files import wandb_config, wandb_history, wandb_offline_runs, wandb_records

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.integrations import (
    MLflowLoggerCallback,
    WandbLoggerCallback,
    setup_mlflow,
    setup_wandb,
)

# Imported before the no_leaks fixture's snapshot: their import-time side effects are theirs
mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")
pytest.importorskip("sqlalchemy")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def train_fn(config):
    for epoch in range(config["epochs"]):
        checkpoint = None
        if epoch == 1:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(str(epoch))
            checkpoint = Checkpoint.from_directory(d)
        train.report({"loss": 1.0 / (epoch + 1), "tag": "x"}, checkpoint=checkpoint)


def fit(storage, callbacks, fn=train_fn, epochs=3, name="run"):
    return DataParallelTrainer(
        fn,
        train_loop_config={"epochs": epochs, "lr": 0.1, "opt": {"name": "sgd"}},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks),
    ).fit()


def test_mlflow_logs_params_metrics_by_step_and_checkpoints(
    storage, tracking_uri, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    callback = MLflowLoggerCallback(
        tracking_uri, experiment_name="exp", save_artifact=True, tags={"team": "a"}
    )
    fit(storage, [callback])
    fit(storage, [MLflowLoggerCallback(tracking_uri, experiment_name="exp")], epochs=2)

    client = mlflow.tracking.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("exp")
    (run,) = client.search_runs([experiment.experiment_id])  # the resumed fit continued it
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.tags["team"] == "a"
    assert run.data.tags["phalanx.run_uri"] == os.path.join(storage, "run")
    assert run.data.params == {"epochs": "3", "lr": "0.1", "opt/name": "sgd"}
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
        (4, 1.0),
        (5, 0.5),
    ]
    iterations = client.get_metric_history(run.info.run_id, "training_iteration")
    assert [m.step for m in iterations] == [1, 2, 3, 4, 5]
    assert "tag" not in run.data.metrics  # text is no MLflow metric
    (artifact,) = client.list_artifacts(run.info.run_id)
    assert artifact.path.startswith("checkpoint_")
    assert [f.path for f in client.list_artifacts(run.info.run_id, artifact.path)] == [
        f"{artifact.path}/state.txt"
    ]


def test_mlflow_marks_a_failed_run(storage, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def fails(config):
        train.report({"loss": 1.0})
        raise RuntimeError("boom")

    with pytest.raises(train.TrainingFailedError):
        fit(storage, [MLflowLoggerCallback(tracking_uri, experiment_name="failing")], fn=fails)
    client = mlflow.tracking.MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert run.info.status == "FAILED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(1, len(steps) + 1))  # a round cut by the failure may be missing


def test_setup_mlflow_logs_from_rank_0_only(storage, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"):  # mlflow.set_* export these
        monkeypatch.setenv(name, "restored after the test")
        monkeypatch.delenv(name)
    seen = []

    class Ranks(train.Callback):
        def on_report(self, run_context, report):
            seen.append([m["kind"] for m in report.metrics])

    def fn(config):
        client = setup_mlflow(
            config,
            tracking_uri=config["uri"],
            experiment_name="workers",
            create_experiment_if_not_exists=True,
        )
        for step in range(3):
            client.log_metric("loss", 1.0 / (step + 1), step=step)
        client.end_run()
        train.report({"kind": type(client).__name__})

    result = DataParallelTrainer(
        fn,
        train_loop_config={"uri": tracking_uri, "lr": 0.5},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name="workers", storage_path=storage, callbacks=[Ranks()]),
    ).fit()
    assert result.metrics == {"kind": "module"}
    assert seen == [["module", "_NoopModule"]]  # rank 0 got mlflow itself, rank 1 a no-op
    client = mlflow.tracking.MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("workers").experiment_id])
    assert run.info.run_name == "workers"
    assert run.data.params == {"uri": tracking_uri, "lr": "0.5"}
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]
    with pytest.raises(ConfigError, match="create_experiment_if_not_exists"):
        setup_mlflow(tracking_uri=tracking_uri, experiment_name="missing")


def test_wandb_offline_run_holds_the_metrics_and_wandb_sync_accepts_it(storage, wandb_service):
    callback = WandbLoggerCallback(
        project="proj", mode="offline", upload_checkpoints=True, excludes=["skip"]
    )
    fit(storage, [callback])
    (run_dir,) = wandb_offline_runs(os.path.join(storage, "run"))
    history = wandb_history(run_dir)
    assert [(h["_step"], h["loss"], h["training_iteration"]) for h in history] == [
        (1, 1.0, 1),
        (2, 0.5, 2),
        (3, pytest.approx(1 / 3), 3),
    ]
    assert wandb_config(run_dir) | {"epochs": 3, "lr": 0.1} == wandb_config(run_dir)
    kinds = [r.WhichOneof("record_type") for r in wandb_records(run_dir)]
    assert "artifact" in kinds  # the checkpoint of round 2, as a model artifact
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", run_dir],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "Would sync 1 run" in out.stdout + out.stderr


def test_setup_wandb_runs_on_rank_0_only(storage, tmp_path, wandb_service):
    seen = []

    class Ranks(train.Callback):
        def on_report(self, run_context, report):
            seen.append([m["kind"] for m in report.metrics])

    def fn(config):
        with setup_wandb(config, project="proj", mode="offline", dir=config["dir"]) as run:
            run.log({"loss": 0.5})
            train.report({"kind": type(run).__name__})

    DataParallelTrainer(
        fn,
        train_loop_config={"dir": str(tmp_path), "lr": 0.5},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name="wb", storage_path=storage, callbacks=[Ranks()]),
    ).fit()
    assert seen == [["Run", "_NoopRun"]]
    (run_dir,) = wandb_offline_runs(str(tmp_path))
    assert [h["loss"] for h in wandb_history(run_dir)] == [0.5]
    assert wandb_config(run_dir)["lr"] == 0.5
