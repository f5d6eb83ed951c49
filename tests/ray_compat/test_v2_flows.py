"""What a Ray Train V2 user's script does, from Ray's own docs and tests, with phalanx imports.

Each test follows one documented flow (getting started, checkpoints, Result inspection,
persistence, validation, restore) in our own code: the script is what a user would write with
``import ray.train as train`` replaced by ``import phalanx as train``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

import phalanx as train
from phalanx import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from phalanx.torch import TorchTrainer, prepare_data_loader, prepare_model

pytestmark = pytest.mark.slow


def _tiny_data(n: int = 64) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def test_getting_started_pytorch(storage):
    """Getting started: prepare_model/prepare_data_loader, a checkpoint per epoch, then load the
    model from result.checkpoint."""

    def train_func(config):
        model = prepare_model(nn.Linear(4, 1))
        loader = prepare_data_loader(
            torch.utils.data.DataLoader(_tiny_data(), batch_size=8, shuffle=True)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        for epoch in range(config["epochs"]):
            if train.get_context().get_world_size() > 1:
                loader.sampler.set_epoch(epoch)
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            with tempfile.TemporaryDirectory() as d:
                checkpoint = None
                if train.get_context().get_world_rank() == 0:
                    torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
                    checkpoint = Checkpoint.from_directory(d)
                train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint)

    result = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05, "epochs": 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage, name="getting_started"),
    ).fit()
    assert result.error is None
    assert result.metrics["epoch"] == 2
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    model = nn.Linear(4, 1)
    model.load_state_dict(state)
    assert result.path.endswith("getting_started")
    assert len(result.metrics_dataframe) == 3


def test_result_inspection(storage):
    """Key concepts / Result: metrics, checkpoint, path, filesystem (pyarrow), best checkpoints,
    get_best_checkpoint (raising for an unknown metric, as Ray does), from_path."""
    import pyarrow.fs

    def train_func():
        for step, loss in enumerate([0.9, 0.2, 0.5]):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "step")).write_text(str(step))
                train.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

    result = train.DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=storage, name="inspect"),
    ).fit()
    assert isinstance(result.filesystem, pyarrow.fs.FileSystem)
    info = result.filesystem.get_file_info(result.path)
    assert info.type == pyarrow.fs.FileType.Directory
    best = result.get_best_checkpoint(metric="loss", mode="min")
    with best.as_directory() as d:
        assert Path(os.path.join(d, "step")).read_text() == "1"
    with pytest.raises(RuntimeError, match="no_such_metric"):
        result.get_best_checkpoint(metric="no_such_metric", mode="min")
    assert [m["loss"] for _, m in result.best_checkpoints] == [0.9, 0.2, 0.5]
    again = train.Result.from_path(result.path)
    assert again.metrics == result.metrics
    assert again.get_best_checkpoint("loss", "max").path.endswith("checkpoint_000000")


def test_no_upload_checkpoint_written_into_the_run_directory(storage):
    """Checkpoints guide, custom upload: write straight to
    get_storage().build_checkpoint_path_from_name(name), report it with NO_UPLOAD."""

    def train_func():
        for i in range(2):
            name = f"epoch_{i}"
            path = train.get_context().get_storage().build_checkpoint_path_from_name(name)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "weights.txt"), "w") as f:
                f.write(str(i))
            train.report(
                {"epoch": i},
                checkpoint=Checkpoint(path),
                checkpoint_dir_name=name,
                checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
            )

    result = train.DataParallelTrainer(
        train_func, run_config=RunConfig(storage_path=storage, name="no_upload")
    ).fit()
    assert result.checkpoint.path.endswith("epoch_1")
    with result.checkpoint.as_directory() as d:
        assert Path(os.path.join(d, "weights.txt")).read_text() == "1"


def test_checkpoint_upload_fn_persists_the_checkpoint_itself(storage, tmp_path):
    """report(checkpoint_upload_fn=...): the function gets the checkpoint and its directory
    name, persists it, returns the persisted Checkpoint; one returned elsewhere is copied in and
    the user's files stay where they are."""
    elsewhere = tmp_path / "my_bucket"

    def upload_into_run(checkpoint, dir_name):
        target = train.get_context().get_storage().build_checkpoint_path_from_name(dir_name)
        checkpoint.to_directory(target)
        return Checkpoint(target)

    def upload_elsewhere(checkpoint, dir_name):
        target = elsewhere / dir_name
        checkpoint.to_directory(str(target))
        return Checkpoint(str(target))

    def train_func():
        for i, upload in enumerate([upload_into_run, upload_elsewhere]):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "i")).write_text(str(i))
                train.report(
                    {"i": i}, checkpoint=Checkpoint.from_directory(d), checkpoint_upload_fn=upload
                )

    result = train.DataParallelTrainer(
        train_func, run_config=RunConfig(storage_path=storage, name="upload_fn")
    ).fit()
    paths = [c.path for c, _ in result.best_checkpoints]
    assert all(p.startswith(result.path) for p in paths)
    for i, (checkpoint, _) in enumerate(result.best_checkpoints):
        with checkpoint.as_directory() as d:
            assert Path(os.path.join(d, "i")).read_text() == str(i)
    assert (elsewhere / "checkpoint_000001" / "i").read_text() == "1"  # the user's copy stays


def test_get_all_reported_checkpoints_during_training(storage):
    """ray.train.get_all_reported_checkpoints(): every rank sees every committed checkpoint
    with rank 0's metrics, as soon as its own report is committed."""

    def train_func():
        seen = []
        for i in range(3):
            with tempfile.TemporaryDirectory() as d:
                rank = train.get_context().get_world_rank()
                Path(os.path.join(d, f"part_{rank}")).write_text(str(i))
                train.report({"i": i, "rank": rank}, checkpoint=Checkpoint.from_directory(d))
            reported = train.get_all_reported_checkpoints()
            seen.append([r.metrics["i"] for r in reported])
            assert all(r.metrics["rank"] == 0 for r in reported)
            assert all(r.status is train.ReportedCheckpointStatus.COMMITTED for r in reported)
        return seen

    result = train.DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage, name="all_reported"),
    ).fit()
    assert result.return_value == [[0], [0, 1], [0, 1, 2]]


def test_validation_runs_in_the_background_and_ranks_checkpoints(storage):
    """ValidationConfig + report(validation=...): the function runs on each committed
    checkpoint; its metrics join the checkpoint's and decide retention by score."""
    calls = []

    def validate(checkpoint, scale=1.0):
        with checkpoint.as_directory() as d:
            step = int(Path(os.path.join(d, "step")).read_text())
        calls.append(step)
        return {"val_loss": round(abs(step - 1.6) * scale, 6)}

    def train_func():
        for step in range(5):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "step")).write_text(str(step))
                train.report(
                    {"step": step},
                    checkpoint=Checkpoint.from_directory(d),
                    validation=train.ValidationTaskConfig(fn_kwargs={"scale": 2.0})
                    if step == 4
                    else True,
                )
        last = train.get_all_reported_checkpoints(
            consistency_mode=train.CheckpointConsistencyMode.VALIDATED
        )
        return {r.metrics["step"]: (r.status.value, r.metrics.get("val_loss")) for r in last}

    result = train.DataParallelTrainer(
        train_func,
        validation_config=train.ValidationConfig(validate),
        run_config=RunConfig(
            storage_path=storage,
            name="validation",
            checkpoint_config=CheckpointConfig(
                num_to_keep=2,
                checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min",
            ),
        ),
    ).fit()
    assert sorted(calls) == [0, 1, 2, 3, 4]
    kept = {m["step"]: m["val_loss"] for _, m in result.best_checkpoints}
    # the two best by validation (steps 2 and 1), and the latest (always kept, as in Ray),
    # whose validation got fn_kwargs (scale=2)
    assert kept == {1: 0.6, 2: 0.4, 4: 4.8}
    assert result.return_value[4] == ("VALIDATED", 4.8)


def test_validation_without_a_validation_config_is_a_clear_error(storage):
    def train_func():
        with tempfile.TemporaryDirectory() as d:
            train.report({"a": 1}, checkpoint=Checkpoint.from_directory(d), validation=True)

    with pytest.raises(train.WorkerGroupError, match="validation_config"):
        train.DataParallelTrainer(
            train_func, run_config=RunConfig(storage_path=storage, name="no_validation")
        ).fit()


def test_restore_and_can_restore_resume_a_run(storage):
    """V1's Trainer.restore(path) / can_restore(path), mapped to phalanx's resume."""

    def train_func(config):
        checkpoint = train.get_checkpoint()
        start = 0
        if checkpoint:
            with checkpoint.as_directory() as d:
                start = int(Path(os.path.join(d, "epoch")).read_text()) + 1
        for epoch in range(start, config["epochs"]):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "epoch")).write_text(str(epoch))
                train.report(
                    {"epoch": epoch, "start": start}, checkpoint=Checkpoint.from_directory(d)
                )
            if epoch == 1 and config["crash"]:
                raise RuntimeError("node lost")

    path = os.path.join(storage, "restorable")
    assert not TorchTrainer.can_restore(path)
    with pytest.raises(train.TrainingFailedError):
        TorchTrainer(
            train_func,
            train_loop_config={"epochs": 4, "crash": True},
            run_config=RunConfig(storage_path=storage, name="restorable"),
        ).fit()
    assert TorchTrainer.can_restore(path)
    trainer = TorchTrainer.restore(
        path, train_func, train_loop_config={"epochs": 4, "crash": False}
    )
    result = trainer.fit()
    assert result.metrics == {"epoch": 3, "start": 2}
    assert result.path == path


def test_async_checkpoint_upload_fn_deletes_the_local_copy_as_ray_does(storage, tmp_path):
    """Checkpoints guide, asynchronous custom upload: ASYNC + checkpoint_upload_fn; the local
    directory goes once uploaded (Ray's default for ASYNC), never the committed checkpoint."""
    local = tmp_path / "local_ckpt"

    def upload(checkpoint, dir_name):
        target = train.get_context().get_storage().build_checkpoint_path_from_name(dir_name)
        checkpoint.to_directory(target)
        return Checkpoint(target)

    def train_func():
        local.mkdir()
        (local / "w").write_text("1")
        train.report(
            {"a": 1},
            checkpoint=Checkpoint.from_directory(str(local)),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=upload,
        )
        in_band = train.get_context().get_storage().build_checkpoint_path_from_name("in_band")
        os.makedirs(in_band)
        Path(os.path.join(in_band, "w")).write_text("2")
        train.report(
            {"a": 2},
            checkpoint=Checkpoint(in_band),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=lambda checkpoint, name: checkpoint,
        )

    result = train.DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(storage_path=storage, name="async_upload_fn"),
    ).fit()
    assert not local.exists()
    first, latest = (c for c, _ in result.best_checkpoints)
    with first.as_directory() as d:
        assert Path(os.path.join(d, "w")).read_text() == "1"
    assert latest.path.endswith("in_band")
    with latest.as_directory() as d:
        assert Path(os.path.join(d, "w")).read_text() == "2"
