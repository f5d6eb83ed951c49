"""One owner per run: a second fit() on a run in use fails at once, naming the owner.

Locally an OS file lock; on object stores (memory://, a real S3 server from moto) a lease with a
heartbeat, taken over when stale.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid

import fsspec
import pytest
from _helpers import moto_s3

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, Result, RunConfig, ScalingConfig, StorageError
from phalanx._internal.storage.run_lock import LEASE_FILE, Owner, RunLock
from phalanx._internal.storage.run_storage import RunStorage

IN_USE = r"is in use by another fit\(\) \(host .+, pid \d+, since .+\)(.|\n)*HINT:"


def checkpointing_loop(config):
    """Three checkpoints, each with a file holding its step; waits on ``hold`` if given."""
    for step in range(3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        hold = config.get("hold")
        if hold:
            deadline = time.monotonic() + 10
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(config.get("pause", 0.0))


def trainer(storage_path, name, config, filesystem=None):
    return DataParallelTrainer(
        checkpointing_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage_path, storage_filesystem=filesystem),
    )


def assert_checkpoints_whole(result_path, filesystem=None):
    """Every committed checkpoint has its file with the right step; nothing empty."""
    result = Result.from_path(result_path, storage_filesystem=filesystem)
    assert result.checkpoint is not None
    for checkpoint, metrics in result.best_checkpoints:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            assert int(f.read()) == metrics["step"]


def race(storage_path, name, filesystem=None):
    """Two fit() calls on one name started together; returns their outcomes."""
    outcomes: list[object] = [None, None]
    barrier = threading.Barrier(2)

    def run(i):
        t = trainer(storage_path, name, {"pause": 0.02}, filesystem)
        barrier.wait()
        try:
            outcomes[i] = t.fit()
        except StorageError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_second_fit_on_a_run_in_use_fails_at_once_naming_the_owner(tmp_path, where):
    root = str(tmp_path / "runs") if where == "local" else f"memory://lock-{uuid.uuid4().hex[:6]}"
    hold = str(tmp_path / "hold")
    first: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: first.update(result=trainer(root, "exp", {"hold": hold}).fit())
    )
    thread.start()
    storage = RunStorage.create(root, "exp")
    deadline = time.monotonic() + 10
    while not storage.filesystem.exists(storage.path("checkpoint_000000")):
        assert time.monotonic() < deadline, "the first fit() never committed"
        time.sleep(0.005)
    with pytest.raises(StorageError, match=IN_USE) as info:
        trainer(root, "exp", {}).fit()
    assert thread.is_alive()  # at once: not after the first fit() (held until `hold`) ended
    assert f"pid {os.getpid()}" in str(info.value) and socket.gethostname() in str(info.value)
    open(hold, "w").close()
    thread.join(30)
    assert first["result"].metrics == {"step": 2}
    assert_checkpoints_whole(first["result"].path)
    # released: the next fit() resumes the run
    again = trainer(root, "exp", {}).fit()
    assert again.attempts == 2


@pytest.mark.parametrize("where", ["local", "memory"])
def test_two_concurrent_fits_on_one_name_never_corrupt_it(tmp_path, where):
    losers = 0
    for trial in range(10):
        if where == "local":
            root = str(tmp_path / "runs")
        else:
            root = f"memory://race-{uuid.uuid4().hex[:6]}"
        name = f"trial{trial}"
        outcomes = race(root, name)
        errors = [o for o in outcomes if isinstance(o, StorageError)]
        assert len(errors) < 2
        for error in errors:
            assert "is in use by another fit()" in str(error) and "HINT:" in str(error)
        assert_checkpoints_whole(f"{root}/{name}")
        losers += len(errors)
    assert losers > 0  # the two did overlap


def test_a_stale_lease_is_taken_over_and_a_fresh_one_is_not(caplog):
    fs = fsspec.filesystem("memory")
    storage = RunStorage.create(f"memory://lease-{uuid.uuid4().hex[:6]}", "exp")
    fs.makedirs(storage.run_path, exist_ok=True)
    dead = Owner("dead", "other-host", 4242, time.time() - 600, time.time() - 300)
    storage.write_atomic(LEASE_FILE, dead.to_json())
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        lock = RunLock.acquire(storage, stale_s=60, settle_s=0.01)
    assert any("Taking over run 'exp'" in r.getMessage() for r in caplog.records)
    try:
        with pytest.raises(StorageError, match=r"in use by another fit\(\) \(host "):
            RunLock.acquire(storage, stale_s=60, settle_s=0.01)
        held = json.loads(storage.read(LEASE_FILE))
        assert held["pid"] == os.getpid() and held["token"] == lock.owner.token
    finally:
        lock.release()
    assert storage.read(LEASE_FILE) is None  # released: deleted
    RunLock.acquire(storage).release()


# -- a real S3 server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    with moto_s3("lock-runs") as fs:
        yield fs


@pytest.mark.slow
def test_two_concurrent_fits_on_s3_never_corrupt_the_run(s3):
    for trial in range(4):
        name = f"trial{trial}-{uuid.uuid4().hex[:4]}"
        outcomes = race("s3://lock-runs/exp", name, s3)
        errors = [o for o in outcomes if isinstance(o, StorageError)]
        assert len(errors) < 2
        for error in errors:
            assert "is in use by another fit()" in str(error)
        assert_checkpoints_whole(f"s3://lock-runs/exp/{name}", s3)
        assert not s3.exists(f"lock-runs/exp/{name}/{LEASE_FILE}")  # both released
