"""A driver that commits checkpoints in a process of its own, for the SIGKILL form of the commit
scenario: it commits round 0 whole, runs the first ``<stop_at>`` steps of round 1's commit,
writes the marker file ``<marker>`` and waits there for the test to kill it (-9). It never goes
on by itself: it waits on stdin, which the test never writes, and exits at EOF (the test ended
without killing it).

    python commit_child.py <marker> <stop_at> <parts> <store kind> <store args...>
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.commit_record import CommitRecord
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.storage.store import RunStore


def open_store(kind: str, args: list[str]) -> RunStore:
    if kind == "local":
        root, name = args
        return RunStorage.create(root, name)
    if kind == "s3":
        import s3fs

        root, name, endpoint = args
        fs = s3fs.S3FileSystem(
            key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}
        )
        return RunStorage.create(root, name, fs)
    raise SystemExit(f"unknown store kind {kind!r}")


def part(parts: str, rank: int, round_: int) -> Checkpoint:
    directory = os.path.join(parts, f"part_r{rank}_{round_}")
    os.makedirs(directory)
    with open(os.path.join(directory, f"shard_{rank}"), "wb") as f:
        f.write(f"{round_}:{rank}".encode())
    return Checkpoint.from_directory(directory)


def commit_steps(
    store: RunStore, manager: CheckpointManager, parts: str, round_: int
) -> list[Callable[[], None]]:
    """The steps of one commit, in the driver's order (the contract's STEPS)."""
    name = f"checkpoint_{round_:06d}"
    record = CommitRecord(name, round_, 1, {"step": round_})
    steps: list[Callable[[], None]] = [
        lambda: store.stage_part(part(parts, 0, round_), name, 1),
        lambda: store.stage_part(part(parts, 1, round_), name, 1),
        lambda: store.commit(name, 1, {"round": round_}, record=record),
        lambda: manager.register(TrackedCheckpoint(name, {"step": round_}, round_)),
    ]
    return steps


def main() -> None:
    marker, stop_at, parts, kind, *args = sys.argv[1:]
    store = open_store(kind, args)
    store.prepare()
    manager = CheckpointManager(store, CheckpointConfig())
    manager.load()
    manager.recover_unindexed()
    manager.begin_attempt()
    for step in commit_steps(store, manager, parts, 0):
        step()
    for step in commit_steps(store, manager, parts, 1)[: int(stop_at)]:
        step()
    with open(marker, "w"):
        pass
    sys.stdin.read()  # the test kills this process here (or closes stdin when it fails first)


if __name__ == "__main__":
    main()
