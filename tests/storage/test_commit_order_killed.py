"""A checkpoint is never visible without its metadata: the process form of
test_commit_small_checkpoint.py's metadata test (which records the fsyncs and the rename).

A real driver process commits a checkpoint with metadata and a preprocessor and is SIGKILLed
the moment the checkpoint is visible (no ``finally``, nothing after it): on local storage right
after the rename, on S3 (a moto server) right after its commit record is written. Whatever a
killed driver leaves visible carries them: the driver writes them first (local: into the staged
directory), never after. (A SIGKILL loses no written file: that the files are also flushed
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
    from phalanx._internal.storage.commit_record import COMMIT_RECORD_FILE, CommitRecord
    from phalanx._internal.storage.run_storage import RunStorage

    part, marker, root, *endpoint = sys.argv[1:]
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


    real_rename, real_write_files = os.rename, object_store.write_files

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if os.fspath(dst) == final:
            die_here()

    def write_files(fs, directory, files):
        real_write_files(fs, directory, files)
        if files and COMMIT_RECORD_FILE in files:
            die_here()

    os.rename, object_store.write_files = rename, write_files
    record = CommitRecord("{name}", 0, 0, {{"epoch": 3}})
    storage.commit("{name}", 0, {{"epoch": 3}}, {{"preprocessor.pkl": b"fitted scaler"}}, record)
    """
).format(name=DIR_NAME)


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with moto_s3("killed-commit") as fs:
        yield fs


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, str, list[str]]:
    """(filesystem, storage_path, the child's store arguments) for one run."""
    if request.param == "local":
        root = str(tmp_path / "runs")
        return fsspec.filesystem("file"), root, [root]
    fs = request.getfixturevalue("s3")
    root = f"s3://killed-commit/{uuid.uuid4().hex[:8]}"
    return fs, root, [root, fs.client_kwargs["endpoint_url"]]


def test_a_driver_killed_as_its_checkpoint_becomes_visible_leaves_it_with_its_metadata(
    tmp_path: Path, store: tuple[Any, str, list[str]]
) -> None:
    fs, root, store_args = store
    part, marker = tmp_path / "part", tmp_path / "visible"
    part.mkdir()
    (part / "model.pt").write_bytes(b"weights")
    child_script = tmp_path / "commit_and_die.py"
    child_script.write_text(CHILD)
    command = [sys.executable, str(child_script), str(part), str(marker), *store_args]
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

    # The rerun finds the commit whole: re-indexed from its record, not set aside.
    storage.prepare()
    manager = CheckpointManager(storage, CheckpointConfig())
    manager.load()
    manager.recover_unindexed()
    assert [c.dir_name for c in manager.checkpoints] == [DIR_NAME]
    assert not [p for p in fs.ls(storage.run_path, detail=False) if "orphaned_" in p]
