"""Fencing, the storage's side: every part and commit names its attempt, and the store refuses one
that is not the run's current attempt of the current driver, writing nothing: a worker of an
earlier attempt (its host cut off, then back) stages nothing, its round is not committed, and a
driver whose lease another driver took over begins, commits, sorts out and writes nothing more.
On the local store and on S3 (a moto server)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_lock import LEASE_FILE, Owner, RunLock
from phalanx._internal.storage.run_storage import (
    ATTEMPT_FILE,
    STAGING_DIR,
    RunStorage,
    StaleAttemptError,
)


def _s3_run(fs: Any, root: str) -> RunStorage:
    storage = RunStorage.create(root, "run", fs)
    storage.prepare()
    return storage


@pytest.fixture(params=["local", "s3"])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> RunStorage:
    """A driver's store of a fresh run, on the local filesystem or on S3."""
    if request.param == "s3":
        return _s3_run(request.getfixturevalue("moto_fs"), request.getfixturevalue("s3_root"))
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    return storage


def _part(tmp_path: Path, name: str, data: bytes) -> Checkpoint:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model.bin").write_bytes(data)
    return Checkpoint.from_directory(str(directory))


def _worker(storage: RunStorage) -> RunStorage:
    """The copy of the store a worker of the current attempt gets (pickled, as engines send it)."""
    return pickle.loads(pickle.dumps(storage))


def _listing(storage: RunStorage) -> set[str]:
    fs = storage.filesystem
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    return {p[len(storage.run_path) :] for p in fs.find(storage.run_path)}


def test_a_stale_attempts_parts_and_commit_are_refused_and_write_nothing(
    driver: RunStorage, tmp_path: Path
) -> None:
    driver.begin_attempt(0)
    old_worker = _worker(driver)
    old_worker.stage_part(_part(tmp_path, "r0", b"attempt 0"), "checkpoint_000001", 0)
    # Attempt 0's host is cut off; the driver gives its workers up and starts attempt 1.
    driver.begin_attempt(1)
    before = _listing(driver)
    # The cut host comes back: its worker saves its next checkpoint, its driver-side round commits.
    with pytest.raises(StaleAttemptError, match=r"current attempt is this driver's attempt 1"):
        old_worker.stage_part(_part(tmp_path, "r0b", b"stale"), "checkpoint_000002", 0)
    with pytest.raises(StaleAttemptError, match="attempt 0"):
        old_worker.mark_in_place("checkpoint_000002", 0)
    with pytest.raises(
        StaleAttemptError, match=r"Refused to commit checkpoint 'checkpoint_000001'"
    ):
        driver.commit("checkpoint_000001", 0, None)
    assert _listing(driver) == before  # nothing written, nothing committed
    # The current attempt stages and commits as before
    _worker(driver).stage_part(_part(tmp_path, "r1", b"attempt 1"), "checkpoint_000002", 1)
    final = driver.commit("checkpoint_000002", 1, None)
    with driver.filesystem.open(f"{final}/model.bin", "rb") as f:
        assert f.read() == b"attempt 1"


def test_another_drivers_attempt_is_not_this_ones_even_with_the_same_index(
    driver: RunStorage, tmp_path: Path
) -> None:
    driver.begin_attempt(0)
    old_worker = _worker(driver)
    successor = RunStorage(driver.filesystem, driver.storage_path, driver.name)  # a new fit()
    successor.begin_attempt(0)
    with pytest.raises(StaleAttemptError, match="another driver's attempt 0"):
        old_worker.stage_part(_part(tmp_path, "r0", b"stale"), "checkpoint_000001", 0)
    with pytest.raises(StaleAttemptError, match=r"another fit\(\) began attempt 0 of this run"):
        driver.commit("checkpoint_000001", 0, None)
    with pytest.raises(StaleAttemptError, match="began attempt 0"):  # deposed: nothing more
        driver.write_atomic("error.txt", b"the old driver's error")
    assert not [p for p in _listing(driver) if p.startswith(f"/{STAGING_DIR}")]


def test_a_driver_whose_lease_was_taken_over_writes_nothing_more(
    tmp_path: Path, moto_fs: Any, s3_root: str
) -> None:
    fs = moto_fs
    old = _s3_run(fs, s3_root)
    old_lock = RunLock.acquire(old, stale_s=60, settle_s=0.01)
    try:
        old.begin_attempt(0)
        old_worker = _worker(old)
        old_worker.stage_part(_part(tmp_path, "r0", b"old"), "checkpoint_000001", 0)
        # The old driver's host is cut off: its lease's heartbeat stops and goes stale.
        stale = Owner(**{**vars(old_lock.owner), "heartbeat": time.time() - 600})
        old.write_atomic(LEASE_FILE, stale.to_json())
        new = RunStorage(fs, old.storage_path, old.name)  # another fit() on the same run
        new_lock = RunLock.acquire(new, stale_s=60, settle_s=0.01)  # takes the run over
        try:
            CheckpointManager(
                new, CheckpointConfig()
            ).recover_unindexed()  # the old attempt's parts: gone
            new.begin_attempt(0)
            _worker(new).stage_part(_part(tmp_path, "r0n", b"new"), "checkpoint_000001", 0)
            before = _listing(new)
            # The old driver's host comes back: its round's commit, its retry, its cleanup
            with pytest.raises(StaleAttemptError, match=r"another fit\(\) holds the run's lease"):
                old.commit("checkpoint_000001", 0, None)
            with pytest.raises(StaleAttemptError, match="lease"):
                old.begin_attempt(1)
            with pytest.raises(StaleAttemptError, match="lease"):
                CheckpointManager(old, CheckpointConfig()).recover_unindexed()
            with pytest.raises(StaleAttemptError, match="lease"):
                old.write_atomic("error.txt", b"the old driver's error")
            with pytest.raises(StaleAttemptError):
                old_worker.stage_part(_part(tmp_path, "r0b", b"stale"), "checkpoint_000002", 0)
            assert _listing(new) == before
            final = new.commit("checkpoint_000001", 0, None)
            with fs.open(f"{final}/model.bin", "rb") as f:
                assert f.read() == b"new"
            assert pickle.loads(pickle.dumps(new)).read(ATTEMPT_FILE) is not None
        finally:
            new_lock.release()
    finally:
        old_lock.release()  # the lease is the new driver's: left alone (released already)
