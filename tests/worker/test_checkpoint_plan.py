"""The plan a reported checkpoint gets where it enters the worker, one row per way of saving.

Each row is what ``report(checkpoint=...)`` was given (upload mode, whether the user's directory
may be deleted, local or remote, an upload function, a ``save_state`` write) and the plan it
must get; ``Session.report`` applies the plan and asks nothing again (the end-to-end behaviour
of each plan is in tests/storage/test_checkpoint_persistence.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fsspec
import pytest

from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.checkpoint_plan import (
    Background,
    InPlace,
    Stage,
    StateJob,
    UserUpload,
    plan_checkpoint,
)
from phalanx._internal.worker.state_writer import StateWriter, WriteJob
from phalanx.checkpoint import Checkpoint, CheckpointUploadMode

SYNC, ASYNC, NO_UPLOAD = (
    CheckpointUploadMode.SYNC,
    CheckpointUploadMode.ASYNC,
    CheckpointUploadMode.NO_UPLOAD,
)


@pytest.fixture
def run(tmp_path: Path) -> RunStorage:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    os.makedirs(storage.run_path)
    return storage


@pytest.fixture
def local(tmp_path: Path) -> Checkpoint:
    path = tmp_path / "runs" / "ckpt"  # beside the run: the same device
    path.mkdir(parents=True)
    return Checkpoint.from_directory(str(path))


@pytest.fixture
def remote() -> Checkpoint:
    fs = fsspec.filesystem("memory")
    fs.makedirs("/plan-test/ckpt", exist_ok=True)
    return Checkpoint("/plan-test/ckpt", filesystem=fs)


def _upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
    return checkpoint


@pytest.mark.parametrize(
    ("mode", "delete", "where", "plan"),
    [
        (SYNC, None, "local", Stage("checkpoint_000003", move=False)),
        (SYNC, True, "local", Stage("checkpoint_000003", move=True)),
        (SYNC, True, "remote", Stage("checkpoint_000003", move=True)),
        (ASYNC, None, "local", Stage("checkpoint_000003", move=True)),  # a rename: no thread
        (ASYNC, False, "local", Background("checkpoint_000003", move_aside=False)),
        (ASYNC, None, "remote", Background("checkpoint_000003", move_aside=False)),
    ],
)
def test_each_mode_gets_its_plan(
    run: RunStorage,
    local: Checkpoint,
    remote: Checkpoint,
    mode: CheckpointUploadMode,
    delete: bool | None,
    where: str,
    plan: object,
) -> None:
    checkpoint = local if where == "local" else remote
    assert plan_checkpoint(run, checkpoint, mode, 3, delete=delete) == plan


def test_a_local_directory_on_another_device_is_moved_aside_then_uploaded(
    run: RunStorage,
) -> None:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # tmpfs: own device
    with tempfile.TemporaryDirectory(dir=shm) as elsewhere:
        plan = plan_checkpoint(run, Checkpoint.from_directory(elsewhere), ASYNC, 0)
        if os.stat(elsewhere).st_dev == os.stat(run.run_path).st_dev:  # one device here
            assert plan == Stage("checkpoint_000000", move=True)
        else:
            assert plan == Background("checkpoint_000000", move_aside=True)


def test_no_upload_names_the_directory_in_the_run(run: RunStorage) -> None:
    path = run.checkpoint_path("my_ckpt")
    os.makedirs(path)
    plan = plan_checkpoint(run, Checkpoint.from_directory(path), NO_UPLOAD, 5)
    assert plan == InPlace("my_ckpt")


def test_an_upload_function_is_planned_with_its_name_and_the_removal(
    run: RunStorage, local: Checkpoint, remote: Checkpoint
) -> None:
    mine = plan_checkpoint(run, local, ASYNC, 1, name="best", upload_fn=_upload)
    assert mine == UserUpload("best", _upload, None, remove_after=True)
    kept = plan_checkpoint(run, remote, ASYNC, 1, delete=True, upload_fn=_upload)
    assert kept == UserUpload("checkpoint_000001", _upload, None, remove_after=False)


def test_a_save_state_write_is_taken_once(run: RunStorage, local: Checkpoint) -> None:
    writer = StateWriter(1)
    job = WriteJob(local.path, lambda: None, blocking=False)
    writer.submit(0, job)
    try:
        assert plan_checkpoint(run, local, SYNC, 2) == StateJob("checkpoint_000002", job)
        assert plan_checkpoint(run, local, SYNC, 3) == Stage("checkpoint_000003", move=False)
    finally:
        writer.close()


def test_what_the_user_must_fix_is_raised_by_the_plan(run: RunStorage, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        plan_checkpoint(run, Checkpoint.from_directory(str(tmp_path / "missing")), SYNC, 0)
    with pytest.raises(ValueError, match="holds the run directory"):
        plan_checkpoint(run, Checkpoint.from_directory(str(tmp_path)), SYNC, 0, delete=True)
    with pytest.raises(ValueError, match="NO_UPLOAD needs a checkpoint directly inside"):
        plan_checkpoint(run, Checkpoint.from_directory(str(tmp_path)), NO_UPLOAD, 0)
