"""Every storage failure is a StorageError naming the path, the cause and a HINT; nothing
half-written stays behind. Real failures: a full tmpfs, /dev/full, botocore without credentials
against a moto server on 127.0.0.1, and a filesystem that fails like a full disk."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import uuid

import pytest
from fsspec.implementations.memory import MemoryFileSystem

import phalanx as train
from phalanx import (
    Checkpoint,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    StorageError,
)
from phalanx._internal.storage.commit_record import read_commit_record
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.storage.snapshot_journal import read_state


def run(storage_path, fn=lambda: None, name="run", filesystem=None, engine="thread"):
    return DataParallelTrainer(
        fn,
        scaling_config=ScalingConfig(num_workers=1, engine=engine),
        run_config=RunConfig(name=name, storage_path=storage_path, storage_filesystem=filesystem),
    ).fit()


def leftovers(run_dir):
    return sorted(
        os.path.relpath(os.path.join(d, f), run_dir)
        for d, _, files in os.walk(run_dir)
        for f in files
        if f.endswith(".tmp")
    )


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@needs_dev_full
def test_a_full_disk_writing_the_snapshot_is_a_storage_error_and_leaves_no_tmp(storage):
    # The snapshot's temporary file is a link to /dev/full: every write to it fails with ENOSPC,
    # from the kernel, exactly as on a full disk. Before: a bare OSError, and the .tmp stayed.
    run_dir = os.path.join(storage, "full")
    os.makedirs(run_dir)
    tmp = os.path.join(run_dir, "checkpoint_manager_snapshot.json.tmp")
    os.symlink("/dev/full", tmp)
    with pytest.raises(StorageError) as info:
        run(storage, name="full")
    message = str(info.value)
    assert f"Could not write {os.path.join(run_dir, 'checkpoint_manager_snapshot.json')!r}" in (
        message
    )
    assert "No space left on device" in message and "HINT: the filesystem holding" in message
    assert not os.path.lexists(tmp)


@needs_dev_full
def test_a_full_history_file_is_a_storage_error_naming_it(storage):
    run_dir = os.path.join(storage, "hist")
    os.makedirs(run_dir)
    os.symlink("/dev/full", os.path.join(run_dir, "metrics.jsonl"))

    def loop():
        train.report({"a": 1})

    with pytest.raises(StorageError, match=r"Could not append to .*metrics\.jsonl.*\n.*HINT"):
        run(storage, loop, name="hist")


@needs_dev_full
def test_a_full_disk_writing_a_commit_record_is_a_storage_error_and_leaves_no_tmp(storage):
    # The first checkpoint's commit record's temporary file is a link to /dev/full: its files
    # are committed, then the write of its record fails with ENOSPC from the kernel, exactly
    # there. Before 4cf3906 the record had no clean-up: the .tmp stayed behind.
    run_dir = os.path.join(storage, "record")
    records = os.path.join(run_dir, ".phalanx_commits")
    os.makedirs(records)
    tmp = os.path.join(records, "checkpoint_000000.json.tmp")
    os.symlink("/dev/full", tmp)

    def loop():
        train.report({"a": 1}, checkpoint=_tiny_checkpoint())

    with pytest.raises(StorageError) as info:
        run(storage, loop, name="record")
    message = str(info.value)
    assert f"Could not commit checkpoint 'checkpoint_000000' in {run_dir!r}" in message
    assert "No space left on device" in message and "HINT: the filesystem holding" in message
    assert not os.path.lexists(tmp)
    assert leftovers(run_dir) == []


@pytest.fixture
def full_disk(tmp_path):
    """A real 1 MB tmpfs (needs root and mount(8); skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield str(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.slow
def test_a_disk_that_fills_up_during_the_run_fails_with_the_path_and_no_half_written_files(
    full_disk,
):
    def loop():
        for step in range(200):  # ~40 KB of history and snapshot per round: 1 MB fills up
            train.report({"step": step, "blob": "x" * 20_000}, checkpoint=_tiny_checkpoint())

    with pytest.raises(StorageError) as info:
        run(full_disk, loop, name="fills", engine="local")
    message = str(info.value)
    run_dir = os.path.join(full_disk, "fills")
    assert run_dir in message and "No space left on device" in message
    assert "HINT: the filesystem holding" in message
    assert leftovers(run_dir) == []
    assert not os.path.exists(os.path.join(run_dir, ".staging"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:  # whole lines only
        steps = [json.loads(line)["step"] for line in f]
    assert steps == list(range(len(steps)))
    with open(os.path.join(run_dir, "checkpoint_manager_snapshot.json")) as f:
        json.load(f)  # the last complete snapshot, never a torn one
    storage = RunStorage.create(full_disk, "fills")
    snapshot = read_state(storage)  # + its journal: what resume reads
    assert snapshot is not None
    on_disk = sorted(n for n in os.listdir(run_dir) if n.startswith("checkpoint_0"))
    indexed = [c["dir_name"] for c in snapshot["checkpoints"]]
    # no uncommitted one: a checkpoint whose commit the full disk cut off before its index entry
    # has its commit record (the next fit() re-indexes it), every other one is in the index
    unindexed = [n for n in on_disk if n not in indexed]
    assert all(read_commit_record(storage, n) is not None for n in unindexed), unindexed
    assert set(indexed) <= set(on_disk)


def _tiny_checkpoint():
    import tempfile

    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "w"), "w") as f:
        f.write("w")
    return Checkpoint.from_directory(directory)


class FullMemoryFileSystem(MemoryFileSystem):
    """Writing the snapshot fails like a full disk (an object store over quota)."""

    protocol = "fullmem"

    def open(self, path, mode="rb", **kwargs):
        if "w" in mode and path.endswith("checkpoint_manager_snapshot.json"):
            raise OSError(28, "No space left on device")
        return super().open(path, mode, **kwargs)


def test_a_remote_storage_failure_on_the_driver_is_a_storage_error_naming_the_uri():
    name = f"q-{uuid.uuid4().hex[:6]}"
    with pytest.raises(StorageError) as info:
        run("/quota", name=name, filesystem=FullMemoryFileSystem())
    message = str(info.value)
    assert f"fullmem://quota/{name}/checkpoint_manager_snapshot.json" in message
    assert "HINT: the filesystem holding" in message


@pytest.fixture
def moto_endpoint():
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_s3_without_credentials_fails_early_in_fit_naming_the_path(
    moto_endpoint, monkeypatch, tmp_path
):
    # Before: a raw botocore NoCredentialsError traceback.
    import s3fs

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3fs.S3FileSystem.clear_instance_cache()
    started = []

    def loop():
        started.append(True)

    with pytest.raises(StorageError) as info:
        run("s3://phalanx-runs/exp", loop, name="nocreds")
    message = str(info.value)
    assert "'s3://phalanx-runs/exp/nocreds'" in message
    assert "NoCredentialsError" in message and "HINT: no valid credentials" in message
    assert started == []  # early: before any worker ran
    s3fs.S3FileSystem.clear_instance_cache()


def test_an_unknown_protocol_package_is_a_storage_error_at_from_path():
    with pytest.raises(StorageError, match=r"Could not open the storage at 'nosuchproto://x'"):
        Result.from_path("nosuchproto://x/run")
