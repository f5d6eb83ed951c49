"""A commit flushes every part before the checkpoint becomes visible, in one syncfs or several
fsyncs at once (B11).

With every rank passing a part, fsyncing them one after another made the commit O(parts) disk
round trips in a row (64 ranks: 64 fsyncs). Where syncfs(2) reports write errors (Linux >= 5.8)
one call flushes them all; elsewhere the fsyncs run in a few threads. Durability first: the
rename that makes the checkpoint visible comes only after the flush returned, and a failed flush
leaves no committed checkpoint.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from phalanx import Checkpoint, StorageError
from phalanx._foundation.fs.syncfs import syncfs
from phalanx._internal.storage import local_store
from phalanx._internal.storage.run_storage import RunStorage

PARTS = 24


def _staged(tmp_path: Path) -> RunStorage:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    for rank in range(PARTS):  # as every rank's report() stages its part
        part = tmp_path / f"rank_{rank}"
        (part / "shards").mkdir(parents=True)
        (part / "shards" / f"shard_{rank}.bin").write_bytes(os.urandom(4096))
        storage.stage_part(Checkpoint.from_directory(str(part)), "checkpoint_000000", 0)
    return storage


@pytest.fixture
def without_syncfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As off Linux or before 5.8: no syncfs to rely on, every path is fsynced."""
    monkeypatch.setattr(local_store, "syncfs", lambda path: False)


def test_one_syncfs_flushes_every_part_before_the_checkpoint_is_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _staged(tmp_path)
    events: list[tuple[str, str]] = []
    real_rename = os.rename

    def recorded_syncfs(path: str) -> bool:
        done = syncfs(path)  # the real call
        events.append(("syncfs" if done else "no syncfs", path))
        return done

    def rename(src: str, dst: str) -> None:
        events.append(("rename", dst))
        real_rename(src, dst)

    monkeypatch.setattr(local_store, "syncfs", recorded_syncfs)
    monkeypatch.setattr(os, "rename", rename)
    final = storage.commit("checkpoint_000000", 0, None)
    staged = storage.staging_path("checkpoint_000000", 0)
    if events[0][0] == "no syncfs":
        pytest.skip("syncfs cannot be relied on here (not Linux >= 5.8): the fsync tests cover it")
    assert events == [("syncfs", staged), ("rename", final)]  # one flush, then visible
    assert sorted(os.listdir(f"{final}/shards")) == sorted(f"shard_{r}.bin" for r in range(PARTS))


def test_a_failed_syncfs_commits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = _staged(tmp_path)

    def failing(path: str) -> bool:  # the disk failed to write something back (EIO)
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.setattr(local_store, "syncfs", failing)
    with pytest.raises(StorageError, match="Input/output error"):
        storage.commit("checkpoint_000000", 0, None)
    assert not os.path.exists(storage.checkpoint_path("checkpoint_000000"))


def test_without_syncfs_every_part_is_fsynced_before_the_checkpoint_is_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_syncfs: None
) -> None:
    storage = _staged(tmp_path)
    events: list[tuple[str, str]] = []
    threads: set[str] = set()
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        threads.add(threading.current_thread().name)

    def rename(src: str, dst: str) -> None:
        events.append(("rename", dst))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    final = storage.commit("checkpoint_000000", 0, None)
    names = [e[1] for e in events]
    renamed = names.index(final)
    staged = storage.staging_path("checkpoint_000000", 0)
    shards = {n for n in names[:renamed] if n.endswith(".bin")}
    assert shards == {f"{staged}/shards/shard_{r}.bin" for r in range(PARTS)}
    assert {staged, f"{staged}/shards"} <= set(names[:renamed])  # the names too
    assert names[renamed + 1 :] == [os.path.dirname(final)]  # the rename itself, last
    assert len(threads) > 1  # several at once
    assert sorted(os.listdir(f"{final}/shards")) == sorted(f"shard_{r}.bin" for r in range(PARTS))


def test_without_syncfs_a_failed_fsync_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_syncfs: None
) -> None:
    storage = _staged(tmp_path)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the disk fails to flush one part (EIO)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("shard_7.bin"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError, match="Input/output error"):
        storage.commit("checkpoint_000000", 0, None)
    assert not os.path.exists(storage.checkpoint_path("checkpoint_000000"))
    assert not [t for t in threading.enumerate() if t.name.startswith("phalanx-fsync")]
