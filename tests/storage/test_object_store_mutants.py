"""The object store's commit path on fsspec's in-memory filesystem, pinned where mutation testing
(``bench/mutation.py``) showed the storage tests let a bug through: a rank's files uploaded and
the local copy kept or removed as asked, a failed upload naming the checkpoint and where it was
going, a commit's metadata and extra files, and the guard against appending to an object store.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import fsspec
import pytest
from _helpers import moto_s3
from fsspec.implementations.memory import MemoryFileSystem

from phalanx import Checkpoint
from phalanx._internal.storage.object_store import ObjectStore
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError


def _memory_run() -> RunStorage:
    storage = RunStorage.create(f"memory://objects-{uuid.uuid4().hex[:8]}", "run")
    fsspec.filesystem("memory").makedirs(storage.run_path, exist_ok=True)
    assert isinstance(storage, ObjectStore)
    return storage


def _part(tmp_path: Path, name: str) -> Checkpoint:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model.bin").write_bytes(b"weights")
    return Checkpoint.from_directory(str(directory))


@pytest.mark.parametrize("move", [False, True], ids=["copy", "move"])
def test_a_part_is_uploaded_and_the_local_directory_kept_unless_moved(
    tmp_path: Path, move: bool
) -> None:
    storage = _memory_run()
    part = _part(tmp_path, "rank0")
    if move:
        storage.stage_part(part, "checkpoint_000000", 0, move=True)
    else:
        storage.stage_part(part, "checkpoint_000000", 0)  # the default: the user's, kept
    final = storage.commit("checkpoint_000000", 0, None)
    assert storage.filesystem.cat(f"{final}/model.bin") == b"weights"
    assert (tmp_path / "rank0").exists() is not move


def test_an_upload_that_fails_names_the_checkpoint_and_its_target(tmp_path: Path) -> None:
    storage = _memory_run()
    missing = Checkpoint.from_directory(str(tmp_path / "never_written"))
    with pytest.raises(StorageError) as raised:
        storage.stage_part(missing, "checkpoint_000003", 0)
    target = storage.path("checkpoint_000003")
    assert str(raised.value).startswith(
        f"Could not save checkpoint 'checkpoint_000003' to {target!r}: FileNotFoundError: "
    )


def test_a_commit_writes_the_metadata_and_extra_files_into_the_checkpoint(tmp_path: Path) -> None:
    storage = _memory_run()
    storage.stage_part(_part(tmp_path, "rank0"), "checkpoint_000001", 0)
    final = storage.commit("checkpoint_000001", 0, {"epoch": 1}, {"preprocessor.pkl": b"scaler"})
    fs = storage.filesystem
    assert json.loads(fs.cat(f"{final}/.metadata.json")) == {"epoch": 1}
    assert fs.cat(f"{final}/preprocessor.pkl") == b"scaler"
    assert fs.cat(f"{final}/model.bin") == b"weights"


def test_an_empty_checkpoint_is_committed_as_a_readable_directory() -> None:
    storage = _memory_run()
    final = storage.commit("checkpoint_000002", 0, None)
    assert storage.filesystem.isdir(final)
    assert storage.filesystem.ls(final, detail=False) == []


def test_appending_to_an_object_store_is_refused_as_a_bug() -> None:
    storage = _memory_run()
    with pytest.raises(StorageError) as raised:
        storage.append_durable("history.jsonl", b"{}\n")
    assert str(raised.value) == (
        f"Cannot append to {storage.uri(storage.path('history.jsonl'))!r}: an object store has "
        "no appends.\nHINT: this is a bug in phalanx: callers must check the store's `appends`."
    )


class _Refusing(MemoryFileSystem):
    """An object store that refuses some requests (expired credentials on one prefix, say)."""

    protocol = "refusing"
    refused: tuple[str, ...] = ("denied",)

    def _open(self, path, mode="rb", **kwargs):  # type: ignore[no-untyped-def]
        if "w" in mode and any(word in path for word in self.refused):
            raise PermissionError(f"Access denied: {path}")
        return super()._open(path, mode, **kwargs)

    def rm(self, path, recursive=False, maxdepth=None):  # type: ignore[no-untyped-def]
        raise PermissionError(f"Access denied: {path}")

    def exists(self, path, **kwargs):  # type: ignore[no-untyped-def]
        if "checkpoint_000009" in path:
            raise PermissionError(f"Access denied: {path}")
        return super().exists(path, **kwargs)


def _refusing_run() -> RunStorage:
    fsspec.register_implementation("refusing", _Refusing, clobber=True)
    storage = RunStorage.create(f"refusing://objects-{uuid.uuid4().hex[:8]}", "run")
    storage.filesystem.makedirs(storage.run_path, exist_ok=True)
    return storage


def test_refused_requests_name_what_phalanx_was_doing_and_where() -> None:
    storage = _refusing_run()
    with pytest.raises(StorageError) as raised:
        storage.write_atomic("denied.json", b"{}")
    uri = storage.uri(storage.path("denied.json"))
    assert str(raised.value).startswith(f"Could not write {uri!r}: PermissionError: ")
    storage.filesystem.pipe(storage.checkpoint_path("checkpoint_000001") + "/a", b"1")
    with pytest.raises(StorageError) as raised:
        storage.delete_checkpoint("checkpoint_000001")
    where = storage.checkpoint_path("checkpoint_000001")
    assert str(raised.value).startswith(f"Could not delete checkpoint {where!r}: PermissionError")
    storage.filesystem.pipe(storage.path(".staging") + "/part", b"1")
    with pytest.raises(StorageError) as raised:
        storage.remove_staging()
    staging = storage.path(".staging")
    assert str(raised.value).startswith(
        f"Could not remove uncommitted checkpoint parts in {staging!r}: PermissionError"
    )
    with pytest.raises(StorageError) as raised:
        storage.commit("checkpoint_000009", 0, None)
    assert str(raised.value).startswith(
        f"Could not commit checkpoint 'checkpoint_000009' in {storage.run_uri!r}: PermissionError"
    )


def test_an_object_store_serves_remote_filesystems_only() -> None:
    assert ObjectStore.serves(fsspec.filesystem("memory"))
    assert not ObjectStore.serves(fsspec.filesystem("file"))


def test_the_rank_logs_of_a_remote_run_go_to_a_private_local_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    storage = _memory_run()
    where = storage.local_log_dir(create=False)  # for readers: nothing is made
    assert os.path.basename(where).startswith("run-")
    made = storage.local_log_dir()  # for the run: made, this user's only
    assert made == where and os.path.isdir(made)
    assert made.startswith(str(tmp_path / "cache"))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700


def test_an_empty_checkpoint_on_s3_is_kept_by_a_directory_marker() -> None:
    # S3 has no directories: without a marker key an empty checkpoint would not exist at all.
    with moto_s3("empty-checkpoints") as fs:
        storage = RunStorage.create("s3://empty-checkpoints/runs", "run", fs)
        final = storage.commit("checkpoint_000000", 0, None)
        fs.invalidate_cache()
        assert fs.isdir(final)
        listing = fs.ls(final, detail=True)
        assert [(e["name"], e["size"]) for e in listing] == [(final + "/", 0)]
