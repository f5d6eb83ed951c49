"""Storage anywhere: a real S3-compatible server on 127.0.0.1 (moto), memory://, slow and failing
filesystems; async uploads; retention; Result.from_path on remote storage."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import fsspec
import pytest
from _helpers import moto_s3
from fsspec.implementations.memory import MemoryFileSystem

import phalanx as train
from phalanx import (
    Checkpoint,
    CheckpointConfig,
    CheckpointUploadMode,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    StorageError,
    TrainingFailedError,
)


@pytest.fixture(scope="module")
def s3():
    with moto_s3("phalanx-runs") as fs:
        yield fs


def loop_with_parts(config):
    """Every rank writes its own file into each checkpoint; rank 0 reports a loss to rank by."""
    rank = train.get_context().get_world_rank()
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step_0")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"step_{rank}"), "w") as f:
                f.write(str(step))
            with open(os.path.join(d, f"weights_{rank}.bin"), "wb") as f:
                f.write(os.urandom(256 << 10))
            train.report(
                {"step": step, "loss": config["losses"][step]},
                checkpoint=Checkpoint.from_directory(d),
                checkpoint_upload_mode=config.get("mode", "sync"),
            )


def fit(
    storage_path, filesystem=None, *, name, steps, workers=2, engine=None, keep=None, mode="sync"
):
    losses = [5.0, 1.0, 4.0, 2.0, 3.0, 0.5, 6.0, 7.0][:steps]
    return DataParallelTrainer(
        loop_with_parts,
        train_loop_config={"steps": steps, "losses": losses, "mode": mode},
        scaling_config=ScalingConfig(num_workers=workers, engine=engine),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            checkpoint_config=CheckpointConfig(
                num_to_keep=keep, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()


def checkpoint_dirs(fs, run_path):
    paths = fs.ls(run_path, detail=False)
    return sorted(p.rsplit("/", 1)[-1] for p in paths if "/checkpoint_0" in p)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_s3_run_with_multi_rank_checkpoints_retention_and_resume(s3, mode):
    name = f"run-{mode}-{uuid.uuid4().hex[:6]}"
    first = fit("s3://phalanx-runs/exp", s3, name=name, steps=4, keep=2, mode=mode)
    run_path = f"phalanx-runs/exp/{name}"
    assert first.path == f"s3://{run_path}"
    # losses 5, 1, 4, 2: the best two are rounds 1 and 3 (3 is also the latest)
    assert checkpoint_dirs(s3, run_path) == ["checkpoint_000001", "checkpoint_000003"]
    assert sorted(p.rsplit("/", 1)[-1] for p in s3.ls(f"{run_path}/checkpoint_000003")) == [
        "step_0",
        "step_1",
        "weights_0.bin",
        "weights_1.bin",
    ]
    assert s3.cat(f"{run_path}/checkpoint_000003/step_1") == b"3"

    resumed = fit("s3://phalanx-runs/exp", s3, name=name, steps=6, keep=2, mode=mode)
    assert list(resumed.metrics_dataframe["step"]) == [0, 1, 2, 3, 4, 5]
    assert checkpoint_dirs(s3, run_path) == ["checkpoint_000001", "checkpoint_000005"]

    reloaded = Result.from_path(resumed.path, storage_filesystem=s3)
    assert reloaded.checkpoint == resumed.checkpoint
    assert reloaded.metrics == {"step": 5, "loss": 0.5}
    assert [m["step"] for _, m in reloaded.best_checkpoints] == [1, 5]
    with reloaded.checkpoint.as_directory() as d:
        assert Path(os.path.join(d, "step_0")).read_text() == "5"


@pytest.mark.slow
def test_s3_missing_bucket_fails_at_fit_naming_the_path(s3):
    with pytest.raises(StorageError, match="no-such-bucket-here/exp/x"):
        fit("s3://no-such-bucket-here/exp", s3, name="x", steps=1)


def test_memory_filesystem_run_and_from_path():
    root = f"memory://phalanx-{uuid.uuid4().hex[:6]}"
    result = fit(root, name="mem", steps=5, engine="thread", keep=1)
    fs = fsspec.filesystem("memory")
    # the best (round 1, loss 1.0) and the latest (round 4) are kept
    assert checkpoint_dirs(fs, result.checkpoint.path.rsplit("/", 1)[0]) == [
        "checkpoint_000001",
        "checkpoint_000004",
    ]
    reloaded = Result.from_path(result.path)
    assert reloaded.metrics_dataframe.equals(result.metrics_dataframe)
    assert reloaded.get_best_checkpoint("loss", "min").path.endswith("checkpoint_000001")


class SlowFileSystem(MemoryFileSystem):
    """Writes to it take 0.1 s per file, like a slow network store."""

    protocol = "slowmem"
    delay_s = 0.1

    def put_file(self, lpath, rpath, *args, **kwargs):
        time.sleep(self.delay_s)
        return super().put_file(lpath, rpath, *args, **kwargs)


def timed_loop(config):
    blocked = 0.0
    for step in range(5):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "model.bin"), "wb") as f:
                f.write(bytes([step]) * 1000)
            start = time.perf_counter()
            train.report(
                {"step": step},
                checkpoint=Checkpoint.from_directory(d),
                checkpoint_upload_mode=config["mode"],
            )
            blocked += time.perf_counter() - start
            time.sleep(0.2)  # "training": longer than an upload, so async hides every upload
    return blocked


@pytest.mark.parametrize("mode", [CheckpointUploadMode.SYNC, CheckpointUploadMode.ASYNC])
def test_a_slow_filesystem_does_not_slow_training_in_async_mode(mode):
    fs = SlowFileSystem()
    result = DataParallelTrainer(
        timed_loop,
        train_loop_config={"mode": mode},
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(
            name=f"slow-{uuid.uuid4().hex[:6]}", storage_path="/slow", storage_filesystem=fs
        ),
    ).fit()
    if mode is CheckpointUploadMode.SYNC:
        assert result.return_value >= 5 * SlowFileSystem.delay_s
    else:
        # relative to the uploads' own time: waiting for even one would cost delay_s
        assert result.return_value < SlowFileSystem.delay_s  # five uploads, none waited for
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3, 4]  # in order
    for step in range(5):  # every upload complete before its commit
        assert (
            fs.cat(f"/slow/{result.path.rsplit('/', 1)[-1]}/checkpoint_{step:06d}/model.bin")
            == bytes([step]) * 1000
        )


class FailingFileSystem(MemoryFileSystem):
    """Writing the third checkpoint fails, like a full disk."""

    protocol = "failmem"

    def put_file(self, lpath, rpath, *args, **kwargs):
        if "checkpoint_000002" in rpath:
            raise OSError(28, "No space left on device")
        return super().put_file(lpath, rpath, *args, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_storage_error_ends_the_run_and_nothing_half_written_is_committed(mode):
    fs = FailingFileSystem()
    name = f"full-{uuid.uuid4().hex[:6]}"
    with pytest.raises(TrainingFailedError) as info:
        DataParallelTrainer(
            timed_loop,
            train_loop_config={"mode": mode},
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(name=name, storage_path="/full", storage_filesystem=fs),
        ).fit()
    message = str(info.value)
    assert "StorageError" in message and "No space left on device" in message
    assert f"/full/{name}/checkpoint_000002" in message
    assert info.value.result.checkpoint.path.endswith("checkpoint_000001")
    assert checkpoint_dirs(fs, f"/full/{name}") == ["checkpoint_000000", "checkpoint_000001"]


def test_no_upload_mode_commits_a_checkpoint_written_in_place(storage):
    def loop():
        run_path = train.get_context().get_storage().run_path
        target = os.path.join(run_path, "written_in_place")
        if train.get_context().get_world_rank() == 0:
            os.makedirs(target)
            with open(os.path.join(target, "w"), "w") as f:
                f.write("x")
        train.report(
            {"a": 1},
            checkpoint=Checkpoint.from_directory(target),
            checkpoint_upload_mode="no_upload",
        )

    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name="inplace", storage_path=storage),
    ).fit()
    assert result.checkpoint.path.endswith("/written_in_place")
    assert os.listdir(result.checkpoint.path) == ["w"]


def empty_checkpoints_loop():
    """Ray's fault-tolerance guide: the save is a comment, so each checkpoint is empty."""
    restored = None
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            restored = os.listdir(d)
    for epoch in range(2):
        with tempfile.TemporaryDirectory() as d:
            train.report(
                {"epoch": epoch, "restored": restored}, checkpoint=Checkpoint.from_directory(d)
            )


@pytest.mark.slow
def test_s3_an_empty_checkpoint_is_committed_and_read_back(s3):
    """An object store has no empty directories: the commit leaves a marker, so the checkpoint
    resumes a run and downloads (as an empty directory)."""
    name = f"empty-{uuid.uuid4().hex[:6]}"

    def run():
        return DataParallelTrainer(
            empty_checkpoints_loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name=name, storage_path="s3://phalanx-runs/exp", storage_filesystem=s3
            ),
        ).fit()

    first = run()
    assert first.metrics == {"epoch": 1, "restored": None}
    resumed = run()  # resumes from the latest, empty, checkpoint
    assert resumed.metrics == {"epoch": 1, "restored": []}
    reloaded = Result.from_path(resumed.path, storage_filesystem=s3)
    with reloaded.checkpoint.as_directory() as d:
        assert os.listdir(d) == []


def test_no_upload_mode_rejects_a_checkpoint_outside_the_run(storage, tmp_path):
    def loop(config):
        train.report(
            {},
            checkpoint=Checkpoint.from_directory(config["dir"]),
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )

    with pytest.raises(TrainingFailedError, match="directly inside the run directory"):
        DataParallelTrainer(
            loop,
            train_loop_config={"dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(name="outside", storage_path=storage),
        ).fit()


def test_an_unwritable_storage_path_fails_at_fit_with_a_hint(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="x", storage_path=str(blocker / "runs")),
    )
    with pytest.raises(StorageError, match="HINT: pick a storage_path"):
        trainer.fit()
