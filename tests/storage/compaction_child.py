"""A run's checkpoint index compacted, and stopped after one of the compaction's steps.

Used two ways by ``test_compaction_crash.py``: imported, the fault is an exception raised in the
test's own process; run as a script (``python compaction_child.py RUNS STEP``), the process
SIGKILLs itself at that point (no ``finally``, no flush), as a machine that loses power would.

The steps of a compaction, in the order phalanx must take them: the new snapshot's temporary
file written and fsynced, renamed over the old snapshot, the directory fsynced (the rename
durable), then the journal the snapshot replaces removed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from phalanx import CheckpointConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage import local_store
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE

# Where the compaction is stopped, each after one more of its steps than the one before.
STEPS = (
    "before the rename",  # the new snapshot's temporary file written and fsynced
    "after the rename",  # the new snapshot in place, the rename not yet durable
    "after the directory fsync",  # the new snapshot durable, the journal still there
    "after the journal removal",  # the compaction done
)
COMMITTED = [f"checkpoint_{i:06d}" for i in range(5)]


def commit_all_then_compact(runs: str, stop_at: str, stop: Callable[[], None]) -> None:
    """Commit ``COMMITTED`` (the first commit compacts, the rest go to the journal), then end
    the attempt with a compaction (``close()``) that ``stop()`` interrupts at ``stop_at``."""
    storage = RunStorage.create(runs, "run")
    storage.prepare()
    manager = cm.CheckpointManager(storage, CheckpointConfig())
    manager.begin_attempt()
    for round_, name in enumerate(COMMITTED):
        os.makedirs(storage.checkpoint_path(name))
        Path(storage.checkpoint_path(name), "model.bin").write_bytes(b"weights")
        manager.register(cm.TrackedCheckpoint(name, {"round": round_}, round_))
    assert storage.read(JOURNAL_FILE), "the commits after the first must be in the journal"
    with stopped_at(storage, stop_at, stop):
        manager.close()  # compacts: the journal's records into the snapshot


@contextmanager
def stopped_at(storage: RunStorage, step: str, stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, the store's own calls run as always but ``stop()`` runs at ``step``."""
    snapshot, journal = storage.path(SNAPSHOT_FILE), storage.path(JOURNAL_FILE)
    replace, unlink, fsync_dir = os.replace, os.unlink, local_store.fsync_path

    def replacing(src: str, dst: str) -> None:
        if dst == snapshot and step == "before the rename":
            stop()
        replace(src, dst)
        if dst == snapshot and step == "after the rename":
            stop()

    def fsyncing(path: str) -> None:
        fsync_dir(path)
        if path == os.path.dirname(snapshot) and step == "after the directory fsync":
            stop()

    def unlinking(path: str) -> None:
        unlink(path)
        if path == journal and step == "after the journal removal":
            stop()

    os.replace, os.unlink = replacing, unlinking  # type: ignore[assignment]
    local_store.fsync_path = fsyncing  # type: ignore[assignment]
    try:
        yield
    finally:
        os.replace, os.unlink, local_store.fsync_path = replace, unlink, fsync_dir  # type: ignore[assignment]


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    commit_all_then_compact(sys.argv[1], sys.argv[2], _kill_self)
    sys.exit(3)  # not killed: the step was never reached
