"""A run whose checkpoint index went missing keeps every checkpoint when it is rerun (issue 40).

The index (``checkpoint_manager_snapshot.json`` and its journal) can be lost by a copy or a sync
that skipped it, a user who took it for a cache file, or a restore from a backup of the
``checkpoint_*`` folders alone. Each checkpoint has its commit record (``.phalanx_commits/``), so
a rerun re-indexes them, resumes from the latest and says so; a directory without a record (the
folders-only backup) is moved aside, never deleted. Local storage and S3 (a moto server) alike,
through real fit() calls.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid

import fsspec
import pytest
from _helpers import moto_s3

import phalanx as train
from phalanx import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._internal.storage.commit_record import COMMIT_RECORDS_DIR, record_file
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE

pytestmark = pytest.mark.slow


def counting_loop(config):
    """Rank 0 writes the step into each checkpoint; a resumed run continues after it."""
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
            train.report(
                {"step": step, "started_at": start}, checkpoint=Checkpoint.from_directory(d)
            )


def fit(storage_path, name, steps, filesystem=None, keep=None):
    return DataParallelTrainer(
        counting_loop,
        train_loop_config={"steps": steps},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            checkpoint_config=CheckpointConfig(num_to_keep=keep),
        ),
    ).fit()


def names(fs, run_path: str) -> list[str]:
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(run_path, detail=False))


def step_in(fs, run_path: str, name: str) -> bytes:
    return fs.cat(f"{run_path}/{name}/step")


CHECKPOINTS = ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]


@pytest.fixture(scope="module")
def s3():
    with moto_s3("lost-index") as fs:
        yield fs


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """(filesystem, storage_path, run path in the filesystem) for one run."""
    name = f"lost-{uuid.uuid4().hex[:6]}"
    if request.param == "local":
        root = str(tmp_path / "runs")
        return fsspec.filesystem("file"), root, name, f"{root}/{name}"
    fs = request.getfixturevalue("s3")
    return fs, "s3://lost-index/runs", name, f"lost-index/runs/{name}"


def _forget(fs, run_path: str, keep: tuple[str, ...]) -> None:
    """Every entry of the run but the checkpoint folders and ``keep`` goes (the index always)."""
    for entry in names(fs, run_path):
        if entry in (SNAPSHOT_FILE, JOURNAL_FILE) or not entry.startswith(keep):
            fs.rm(f"{run_path}/{entry}", recursive=True)


@pytest.mark.parametrize("lost", ["the index", "all but the checkpoints and their records"])
def test_a_rerun_whose_index_went_missing_keeps_every_checkpoint_and_resumes_from_the_latest(
    store, lost, caplog
):
    fs, root, name, run_path = store
    first = fit(root, name, steps=3, filesystem=None if fs.protocol == "file" else fs)
    assert first.metrics["step"] == 2
    everything = ("",)  # every entry starts with ""
    _forget(
        fs, run_path, everything if lost == "the index" else ("checkpoint_", COMMIT_RECORDS_DIR)
    )
    assert SNAPSHOT_FILE not in names(fs, run_path)

    with caplog.at_level(logging.WARNING, logger="phalanx"):
        rerun = fit(root, name, steps=5, filesystem=None if fs.protocol == "file" else fs)
    # every committed checkpoint kept with its files; the rerun continued after the latest
    listed = [n for n in names(fs, run_path) if n.startswith("checkpoint_0")]
    assert listed == [*CHECKPOINTS, "checkpoint_000003", "checkpoint_000004"]
    assert [step_in(fs, run_path, n) for n in CHECKPOINTS] == [b"0", b"1", b"2"]
    assert rerun.metrics == {"step": 4, "started_at": 3}
    assert [c.path.rsplit("/", 1)[-1] for c, _ in rerun.best_checkpoints] == listed
    said = [r.getMessage() for r in caplog.records]
    for name_ in CHECKPOINTS:
        assert any(m.startswith(f"{name_} is a committed checkpoint") for m in said), said
    assert any(
        "from checkpoint_000002; its index was rebuilt from the checkpoints' commit records" in m
        for m in said
    ), said
    assert not any(m.startswith("Removing") for m in said), said


def test_a_checkpoint_directory_without_a_commit_record_is_moved_aside_not_deleted(store, caplog):
    fs, root, name, run_path = store
    filesystem = None if fs.protocol == "file" else fs
    fit(root, name, steps=2, filesystem=filesystem)
    # a commit cut off before its record (or files a user put there): not provably whole
    fs.makedirs(f"{run_path}/checkpoint_000009", exist_ok=True)
    fs.pipe(f"{run_path}/checkpoint_000009/model.bin", b"half a model")
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        rerun = fit(root, name, steps=3, filesystem=filesystem)
    assert rerun.metrics["step"] == 2  # resumed from checkpoint_000001, as the index says
    listed = names(fs, run_path)
    assert "checkpoint_000009" not in listed
    (aside,) = [n for n in listed if n.startswith("orphaned_")]
    assert fs.cat(f"{run_path}/{aside}/checkpoint_000009/model.bin") == b"half a model"
    warned = [r.getMessage() for r in caplog.records if "checkpoint_000009" in r.getMessage()]
    assert len(warned) == 1 and "moved to" in warned[0] and "not deleted" in warned[0]
    assert aside in warned[0]
    # a later rerun leaves the folder set aside alone
    fit(root, name, steps=4, filesystem=filesystem)
    assert fs.cat(f"{run_path}/{aside}/checkpoint_000009/model.bin") == b"half a model"


def test_a_backup_of_the_checkpoint_folders_alone_is_set_aside_whole_not_deleted(store, caplog):
    """Without the index and the commit records nothing says the folders are whole: the rerun
    starts afresh, and every folder waits in orphaned_<time>/ with a HINT to resume from it."""
    fs, root, name, run_path = store
    filesystem = None if fs.protocol == "file" else fs
    fit(root, name, steps=3, filesystem=filesystem)
    _forget(fs, run_path, ("checkpoint_0",))
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        rerun = fit(root, name, steps=1, filesystem=filesystem)
    assert rerun.metrics == {"step": 0, "started_at": 0}
    (aside,) = [n for n in names(fs, run_path) if n.startswith("orphaned_")]
    assert sorted(names(fs, f"{run_path}/{aside}")) == CHECKPOINTS
    assert [step_in(fs, f"{run_path}/{aside}", n) for n in CHECKPOINTS] == [b"0", b"1", b"2"]
    hints = [r.getMessage() for r in caplog.records if "resume_from_checkpoint" in r.getMessage()]
    assert len(hints) == len(CHECKPOINTS)


def test_a_record_copied_in_from_another_checkpoint_does_not_make_a_directory_committed(
    tmp_path,
):
    root, name = str(tmp_path / "runs"), "copied"
    fit(root, name, steps=1)
    run = os.path.join(root, name)
    os.makedirs(os.path.join(run, "checkpoint_000005"))
    with open(os.path.join(run, record_file("checkpoint_000000")), "rb") as f:
        record = f.read()
    with open(os.path.join(run, record_file("checkpoint_000005")), "wb") as f:
        f.write(record)  # names checkpoint_000000: proves nothing about this directory
    rerun = fit(root, name, steps=2)
    assert rerun.metrics["step"] == 1  # resumed from checkpoint_000000, not from "round 5"
    assert "checkpoint_000005" not in os.listdir(run)


def test_a_checkpoint_holds_the_user_s_files_alone_and_its_record_goes_with_it(tmp_path):
    """The record is beside the checkpoint, not in it; retention deletes both."""
    root, name = str(tmp_path / "runs"), "alone"
    result = fit(root, name, steps=3, keep=1)
    assert os.listdir(result.checkpoint.path) == ["step"]
    run = os.path.join(root, name)
    assert sorted(os.listdir(os.path.join(run, COMMIT_RECORDS_DIR))) == ["checkpoint_000002.json"]
