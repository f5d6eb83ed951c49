"""A checkpoint is never visible without its metadata: the process form of
test_commit_small_checkpoint.py's metadata test (which records the fsyncs and the rename).

A real driver process commits a checkpoint with metadata and a preprocessor and is SIGKILLed
the moment the rename makes the checkpoint visible (no ``finally``, no flush after it). Whatever
a killed driver leaves visible carries them: the driver writes them into the staged directory
before the rename, never into the checkpoint after it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from _helpers import wait_until

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_storage import RunStorage

DIR_NAME = "checkpoint_000000"

# Commits DIR_NAME; right after the rename that makes it visible, writes the marker and waits
# on stdin for the test to kill it (it exits at EOF, when the test failed before killing it).
CHILD = textwrap.dedent(
    """
    import os, sys
    from phalanx import Checkpoint
    from phalanx._internal.storage.commit_record import CommitRecord
    from phalanx._internal.storage.run_storage import RunStorage

    root, part, marker = sys.argv[1:]
    storage = RunStorage.create(root, "run")
    storage.prepare()
    storage.stage_part(Checkpoint.from_directory(part), "{name}", 0)
    final = storage.checkpoint_path("{name}")
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if os.fspath(dst) == final:  # visible now: die here
            open(marker, "w").close()
            sys.stdin.read()

    os.rename = rename
    record = CommitRecord("{name}", 0, 0, {{"epoch": 3}})
    storage.commit("{name}", 0, {{"epoch": 3}}, {{"preprocessor.pkl": b"fitted scaler"}}, record)
    """
).format(name=DIR_NAME)


def test_a_driver_killed_as_its_checkpoint_becomes_visible_leaves_it_with_its_metadata(
    tmp_path: Path,
) -> None:
    part, marker, root = tmp_path / "part", tmp_path / "visible", tmp_path / "runs"
    part.mkdir()
    (part / "model.pt").write_bytes(b"weights")
    child_script = tmp_path / "commit_and_die.py"
    child_script.write_text(CHILD)
    command = [sys.executable, str(child_script), str(root), str(part), str(marker)]
    with subprocess.Popen(command, stdin=subprocess.PIPE) as child:
        try:
            wait_until(lambda: marker.exists() or child.poll() is not None, 60, "the rename")
            assert child.poll() is None, f"the committing process exited ({child.returncode})"
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL

    final = root / "run" / DIR_NAME
    assert (final / "model.pt").read_bytes() == b"weights"
    assert (final / "preprocessor.pkl").read_bytes() == b"fitted scaler"
    assert Checkpoint.from_directory(str(final)).get_metadata() == {"epoch": 3}
    assert json.loads((final / ".metadata.json").read_text()) == {"epoch": 3}

    # The rerun finds the commit whole: re-indexed from its record, not set aside.
    storage = RunStorage.create(str(root), "run")
    storage.prepare()
    manager = CheckpointManager(storage, CheckpointConfig())
    manager.load()
    manager.recover_unindexed()
    assert [c.dir_name for c in manager.checkpoints] == [DIR_NAME]
    assert sorted(p.name for p in (root / "run").iterdir() if p.name.startswith("orphaned_")) == []
