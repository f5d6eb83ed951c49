"""The local store's commit path, run lock and small reads, pinned where mutation testing
(``bench/mutation.py``) showed the storage tests let a bug through: a rank's part copied (never
the storage inside it) or moved, the errors for a part that cannot be saved, a checkpoint no rank
wrote and a name used twice, NO_UPLOAD parts joined with metadata, which flush a commit uses;
who the loser of a second ``fit()`` is told holds the run, the lock file's permissions, a
filesystem without locks, and a log that does not exist yet.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import threading
import uuid
from pathlib import Path

import fsspec
import pytest

from phalanx import Checkpoint
from phalanx._internal.storage import local_store
from phalanx._internal.storage.claim import LOCK_FILE, Owner
from phalanx._internal.storage.local_store import FileLock
from phalanx._internal.storage.run_lock import RunLock
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError

LOGGER = "phalanx._internal.storage.local_store"


def _run(tmp_path: Path) -> RunStorage:
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    storage.prepare()
    return storage


def test_a_held_run_names_its_holder_from_the_lock_file(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    held = RunLock.acquire(storage)
    try:
        assert Owner.from_json(Path(storage.path(LOCK_FILE)).read_bytes()) == held.owner
        with pytest.raises(StorageError) as raised:
            RunLock.acquire(storage)  # a second open file description: flock refuses it
        assert str(raised.value).splitlines()[0] == (
            f"Run 'exp' at {storage.run_uri!r} is in use by another fit() "
            f"({held.owner.describe()})."
        )
    finally:
        held.release()
    again = RunLock.acquire(storage)  # released: the next fit() takes it
    again.release()


def test_the_lock_file_is_readable_by_others_and_writable_by_its_owner(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    umask = os.umask(0o022)
    try:
        lock = RunLock.acquire(storage)
        lock.release()
    finally:
        os.umask(umask)
    mode = stat.S_IMODE(os.stat(storage.path(LOCK_FILE)).st_mode)
    assert mode == 0o644


def test_a_filesystem_without_locks_warns_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = _run(tmp_path)

    def no_locks(fd: int, operation: int) -> None:  # as some network mounts answer
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        owner = Owner.me()
        lock = FileLock.take(storage, owner)  # type: ignore[arg-type]
    assert lock.owner == owner  # the run is still this fit()'s, unlocked
    lock.release()  # nothing to unlock: no error
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        f"Cannot lock the run directory {storage.run_path!r} ([Errno {errno.ENOLCK}] No locks "
        "available): nothing stops another fit() from using it at the same time."
    ]


def test_a_log_not_written_yet_reads_as_empty(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    assert storage.read_log("never_written.jsonl") == b""


def _user_dir(tmp_path: Path, name: str = "ckpt") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model.bin").write_bytes(b"weights")
    return directory


def test_a_part_is_copied_and_the_users_directory_kept_even_around_the_storage(
    tmp_path: Path,
) -> None:
    # The storage may live inside the directory the user checkpoints: never copy it into itself.
    user = _user_dir(tmp_path)
    storage = RunStorage.create(str(user / "runs"), "exp")
    storage.prepare()
    storage.stage_part(Checkpoint.from_directory(str(user)), "checkpoint_000000", 0)
    final = storage.commit("checkpoint_000000", 0, None)
    assert sorted(os.listdir(final)) == ["model.bin"]
    assert (user / "model.bin").read_bytes() == b"weights"


def test_a_moved_part_leaves_the_users_directory_and_lands_whole(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    user = _user_dir(tmp_path)
    storage.stage_part(Checkpoint.from_directory(str(user)), "checkpoint_000000", 0, move=True)
    final = storage.commit("checkpoint_000000", 0, {"epoch": 1})
    assert not user.exists()
    assert Path(final, "model.bin").read_bytes() == b"weights"
    assert json.loads(Path(final, ".metadata.json").read_text()) == {"epoch": 1}


def test_a_part_from_another_filesystem_is_copied_in(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    remote = f"memory://parts-{uuid.uuid4().hex[:8]}/ckpt"
    fsspec.filesystem("memory").pipe(f"{remote}/model.bin", b"weights")
    storage.stage_part(Checkpoint(remote), "checkpoint_000000", 0)
    final = storage.commit("checkpoint_000000", 0, None)
    assert Path(final, "model.bin").read_bytes() == b"weights"


def test_a_part_that_cannot_be_saved_names_the_checkpoint_and_its_target(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    missing = Checkpoint.from_directory(str(tmp_path / "never_written"))
    with pytest.raises(StorageError) as raised:
        storage.stage_part(missing, "checkpoint_000003", 0)
    target = storage.staging_path("checkpoint_000003", 0)
    assert str(raised.value).startswith(
        f"Could not save checkpoint 'checkpoint_000003' to {target!r}: FileNotFoundError: "
    )


def test_a_checkpoint_no_rank_wrote_is_refused_with_the_no_upload_hint(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    final = storage.checkpoint_path("checkpoint_000004")
    with pytest.raises(StorageError) as raised:
        storage.commit("checkpoint_000004", 0, {"epoch": 4})
    assert str(raised.value) == (
        f"Checkpoint 'checkpoint_000004' has no files: no rank's part reached {final!r}.\n"
        "HINT: with checkpoint_upload_mode=NO_UPLOAD, write the files to "
        "get_context().get_storage().build_checkpoint_path_from_name(name) first."
    )


def test_a_no_upload_checkpoint_gets_its_metadata_and_the_other_ranks_parts(
    tmp_path: Path,
) -> None:
    storage = _run(tmp_path)
    final = Path(storage.checkpoint_path("checkpoint_000005"))
    final.mkdir()
    (final / "rank0.bin").write_bytes(b"0")  # rank 0 wrote in place (NO_UPLOAD)
    storage.mark_in_place("checkpoint_000005", 0)
    storage.stage_part(Checkpoint.from_directory(str(_user_dir(tmp_path))), "checkpoint_000005", 0)
    storage.commit("checkpoint_000005", 0, {"epoch": 5}, {"extra.txt": b"x"})
    assert sorted(os.listdir(final)) == [".metadata.json", "extra.txt", "model.bin", "rank0.bin"]
    assert json.loads((final / ".metadata.json").read_text()) == {"epoch": 5}

    only_in_place = Path(storage.checkpoint_path("checkpoint_000006"))
    only_in_place.mkdir()
    (only_in_place / "rank0.bin").write_bytes(b"0")
    storage.commit("checkpoint_000006", 0, {"epoch": 6})  # no staged part at all
    assert json.loads((only_in_place / ".metadata.json").read_text()) == {"epoch": 6}


def test_a_checkpoint_name_used_twice_is_refused(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    storage.stage_part(Checkpoint.from_directory(str(_user_dir(tmp_path, "a"))), "epoch_1", 0)
    storage.commit("epoch_1", 0, None)
    storage.stage_part(Checkpoint.from_directory(str(_user_dir(tmp_path, "b"))), "epoch_1", 1)
    with pytest.raises(StorageError) as raised:
        storage.commit("epoch_1", 1, None)
    assert str(raised.value) == (
        f"Checkpoint directory {storage.checkpoint_path('epoch_1')!r} already exists.\n"
        "HINT: checkpoint_dir_name must be unique within a run."
    )


def test_deleting_a_checkpoint_that_is_gone_is_quiet(tmp_path: Path) -> None:
    storage = _run(tmp_path)
    storage.delete_checkpoint("checkpoint_000099")  # evicted twice, or never committed


def test_a_new_owner_replaces_a_longer_stale_lock_record_and_release_twice_is_quiet(
    tmp_path: Path,
) -> None:
    storage = _run(tmp_path)
    Path(storage.path(LOCK_FILE)).write_text("x" * 500)  # a dead owner's longer record
    lock = RunLock.acquire(storage)
    assert Owner.from_json(Path(storage.path(LOCK_FILE)).read_bytes()) == lock.owner
    lock.release()
    lock.release()


def _commit_files(storage: RunStorage, tmp_path: Path, files: int) -> None:
    """Commit, as round 0, a user's checkpoint of ``files`` one-byte files."""
    user = tmp_path / "ckpt"
    user.mkdir()
    for i in range(files):
        (user / f"part{i}.bin").write_bytes(b"w")
    storage.stage_part(Checkpoint.from_directory(str(user)), "checkpoint_000000", 0)
    storage.commit("checkpoint_000000", 0, None)


@pytest.mark.parametrize(("files", "flushed_by"), [(1, "MainThread"), (2, "phalanx-fsync")])
def test_a_small_checkpoint_is_flushed_in_place_and_a_larger_one_by_the_flush_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, flushed_by: str
) -> None:
    storage = _run(tmp_path)  # before the patch: only the commit's flushes are counted
    threads: list[str] = []
    real = local_store.fsync_path

    def recorded(path: str) -> None:
        threads.append(threading.current_thread().name)
        real(path)

    monkeypatch.setattr(local_store, "fsync_path", recorded)
    _commit_files(storage, tmp_path, files)  # 1 file + its directory: 2 paths; 2 files: 3 paths
    flushes = threads[:-1]  # the last one is the run directory's, after the rename
    assert len(flushes) == files + 1
    assert all(name.startswith(flushed_by) for name in flushes), threads


@pytest.mark.parametrize(("files", "syncfs_calls"), [(7, 0), (8, 1)])
def test_syncfs_flushes_a_checkpoint_of_more_than_eight_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, syncfs_calls: int
) -> None:
    storage = _run(tmp_path)
    calls: list[str] = []

    def recorded_syncfs(path: str) -> bool:
        calls.append(path)
        return True  # as where syncfs reports write errors

    monkeypatch.setattr(local_store, "syncfs", recorded_syncfs)
    _commit_files(storage, tmp_path, files)  # files + the directory: 8 or 9 paths
    assert len(calls) == syncfs_calls
