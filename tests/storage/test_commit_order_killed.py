"""A checkpoint is never visible without its metadata: the process form of
test_commit_small_checkpoint.py's metadata test (which records the fsyncs and the rename).

A real driver process commits a checkpoint with metadata and a preprocessor and is SIGKILLed
(no ``finally``, nothing after it) the moment the checkpoint is visible (local storage: right
after the rename, before its commit record) or right after its commit record is written (local
storage and S3, a moto server). Whatever a killed driver leaves visible carries them: the driver
writes them first (local: into the staged directory), never after. The rerun re-indexes a
checkpoint with its record and sets one without it aside, whole. (A SIGKILL loses no written file: that the files are also flushed
before the rename is test_commit_small_checkpoint.py's to see.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from _helpers import moto_s3, wait_until

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_storage import RunStorage

DIR_NAME = "checkpoint_000000"

# Commits DIR_NAME; the moment the checkpoint is visible (local: the rename; an object store: its
# commit record, the object whose presence proves the commit whole) writes the marker and waits
# on stdin for the test to kill it (it exits at EOF, when the test failed before killing it).
CHILD = textwrap.dedent(
    """
    import os, sys
    from phalanx import Checkpoint
    from phalanx._internal.storage import object_store
    from phalanx._internal.storage.commit_record import CommitRecord, record_file
    from phalanx._internal.storage.run_storage import RunStorage

    point, part, marker, root, *endpoint = sys.argv[1:]
    fs = None
    if endpoint:
        import s3fs

        kwargs = {{"endpoint_url": endpoint[0], "region_name": "us-east-1"}}
        fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs=kwargs)
    storage = RunStorage.create(root, "run", fs)
    storage.prepare()
    storage.stage_part(Checkpoint.from_directory(part), "{name}", 0)
    final = storage.checkpoint_path("{name}")


    def die_here():
        open(marker, "w").close()
        sys.stdin.read()


    real_rename, real_replace = os.rename, os.replace
    real_write_record = object_store.write_commit_record

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if point == "rename" and os.fspath(dst) == final:
            die_here()

    def replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if point == "record" and os.fspath(dst) == storage.path(record_file("{name}")):
            die_here()

    def write_record(store, record):
        real_write_record(store, record)
        if point == "record":
            die_here()

    os.rename, os.replace, object_store.write_commit_record = rename, replace, write_record
    record = CommitRecord("{name}", 0, 0, {{"epoch": 3}})
    storage.commit("{name}", 0, {{"epoch": 3}}, {{"preprocessor.pkl": b"fitted scaler"}}, record)
    """
).format(name=DIR_NAME)


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with moto_s3("killed-commit") as fs:
        yield fs


@pytest.fixture(params=["local: the rename", "local: the record", "s3: the record"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, str, list[str]]:
    """(filesystem, storage_path, the child's arguments: where it dies, its store) for one run."""
    kind, point = request.param.split(": the ")
    if kind == "local":
        root = str(tmp_path / "runs")
        return fsspec.filesystem("file"), root, [point, root]
    fs = request.getfixturevalue("s3")
    root = f"s3://killed-commit/{uuid.uuid4().hex[:8]}"
    return fs, root, [point, root, fs.client_kwargs["endpoint_url"]]


def test_a_driver_killed_as_its_checkpoint_becomes_visible_leaves_it_with_its_metadata(
    tmp_path: Path, store: tuple[Any, str, list[str]]
) -> None:
    fs, root, store_args = store
    part, marker = tmp_path / "part", tmp_path / "visible"
    part.mkdir()
    (part / "model.pt").write_bytes(b"weights")
    child_script = tmp_path / "commit_and_die.py"
    child_script.write_text(CHILD)
    point, *where = store_args
    command = [sys.executable, str(child_script), point, str(part), str(marker), *where]
    with subprocess.Popen(command, stdin=subprocess.PIPE) as child:
        try:
            wait_until(lambda: marker.exists() or child.poll() is not None, 60, "the commit")
            assert child.poll() is None, f"the committing process exited ({child.returncode})"
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL

    storage = RunStorage.create(root, "run", None if root.startswith("/") else fs)
    final = storage.checkpoint_path(DIR_NAME)
    assert fs.cat_file(f"{final}/model.pt") == b"weights"
    assert fs.cat_file(f"{final}/preprocessor.pkl") == b"fitted scaler"
    assert json.loads(fs.cat_file(f"{final}/.metadata.json")) == {"epoch": 3}
    assert Checkpoint(final, fs).get_metadata() == {"epoch": 3}

    # The rerun re-indexes a commit with its record; without one it sets the directory aside,
    # whole (metadata and all), never deletes it.
    storage.prepare()
    manager = CheckpointManager(storage, CheckpointConfig())
    manager.load()
    recovery = manager.recover_unindexed()
    aside = [p for p in fs.ls(storage.run_path, detail=False) if "orphaned_" in p]
    if point == "record":
        assert [c.dir_name for c in manager.checkpoints] == [DIR_NAME]
        assert not aside
    else:
        assert recovery.set_aside == [DIR_NAME] and manager.checkpoints == []
        (folder,) = aside
        assert fs.cat_file(f"{folder}/{DIR_NAME}/preprocessor.pkl") == b"fitted scaler"
        assert json.loads(fs.cat_file(f"{folder}/{DIR_NAME}/.metadata.json")) == {"epoch": 3}
