"""The layout of one run in storage, and the two steps of a checkpoint: stage a part, commit.

::

    <storage_path>/<name>/
      checkpoint_manager_snapshot.json   committed checkpoints and their metrics (source of truth)
      metrics.jsonl                      every round: rank 0's metrics (+ training_iteration, ...)
      metrics_all_ranks.jsonl            every report of every rank
      checkpoint_000004/                 committed checkpoints (or a user checkpoint_dir_name)
      .staging/<dir_name>.<attempt>/     parts being written; renamed into place on commit
      logs/rank_<r>.log                  each rank's stdout and stderr
      error.txt, error.pkl               the failure, if the run failed

A part is staged by the rank that owns the files; the driver commits once every participating
rank's part is durable. On a local filesystem the commit is one rename, so a reader never sees a
partial checkpoint. Object stores have no rename: parts are uploaded straight to the final prefix
and the commit is the snapshot listing it (readers and resume go by the snapshot); parts of a
round that never committed are deleted when the attempt ends or the run resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

from phalanx._internal.storage.filesystem import (
    copy_tree,
    is_local,
    move_tree_contents,
    private_log_dir,
    resolve_filesystem,
    storage_error,
    storage_errors,
)
from phalanx.errors import StorageError

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
HISTORY_FILE = "metrics.jsonl"
ALL_RANKS_HISTORY_FILE = "metrics_all_ranks.jsonl"
STAGING_DIR = ".staging"
LOG_DIR = "logs"
ERROR_TEXT_FILE = "error.txt"
ERROR_PICKLE_FILE = "error.pkl"
MARKER_FILE = ".phalanx_run"


@dataclass(frozen=True)
class RunStorage:
    """Where one run lives. Picklable: workers get a copy to stage their checkpoint parts."""

    filesystem: Any
    storage_path: str
    name: str

    @classmethod
    def create(cls, storage_path: str, name: str, filesystem: Any = None) -> RunStorage:
        with storage_errors("open the storage at", os.fspath(storage_path)):
            fs, root = resolve_filesystem(storage_path, filesystem)
        return cls(fs, root.rstrip("/") or "/", name)

    @property
    def run_path(self) -> str:
        return f"{self.storage_path}/{self.name}"

    @property
    def local(self) -> bool:
        return is_local(self.filesystem)

    @property
    def run_uri(self) -> str:
        """The run directory as a path (local) or URI (``s3://bucket/...``)."""
        if self.local:
            return self.run_path
        protocol = self.filesystem.protocol
        scheme = protocol[0] if isinstance(protocol, tuple | list) else protocol
        return f"{scheme}://{self.run_path.lstrip('/')}"

    def path(self, *parts: str) -> str:
        return "/".join((self.run_path, *parts))

    def checkpoint_path(self, dir_name: str) -> str:
        return self.path(dir_name)

    def staging_path(self, dir_name: str, attempt: int) -> str:
        return self.path(STAGING_DIR, f"{dir_name}.{attempt}")

    def local_log_dir(self) -> str:
        """Where per-rank logs are written (the run directory when storage is local)."""
        if self.local:
            return self.path(LOG_DIR)
        return private_log_dir(self.name, self.run_uri)

    # -- set-up ---------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the run directory and prove it is writable; drop leftovers of cut-off commits."""
        fs = self.filesystem
        with storage_errors("write to the run directory", self.run_uri):
            fs.makedirs(self.run_path, exist_ok=True)
            with fs.open(self.path(MARKER_FILE), "w") as f:
                f.write("phalanx run directory\n")
        self.remove_staging()

    def remove_staging(self) -> None:
        """Drop staged parts that were never committed (a failed or cut-off attempt)."""
        staging = self.path(STAGING_DIR)
        if self.local:  # a worker that is being torn down may still be writing here
            shutil.rmtree(staging, ignore_errors=True)
            return
        with storage_errors("remove uncommitted checkpoint parts in", staging):
            if self.filesystem.exists(staging):
                self.filesystem.rm(staging, recursive=True)

    # -- checkpoints ----------------------------------------------------------------------------

    def stage_part(self, source: Any, dir_name: str, attempt: int) -> None:
        """Put one rank's checkpoint files into the staging directory of ``dir_name``.

        ``source`` is a :class:`~phalanx.Checkpoint`. A local directory on the same filesystem is
        moved entry by entry (rename, no copy); anything else is copied.
        """
        target = self.staging_path(dir_name, attempt) if self.local else self.path(dir_name)
        try:
            if self.local and is_local(source.filesystem):
                move_tree_contents(source.path, target)
            else:
                copy_tree(source.filesystem, source.path, self.filesystem, target)
        except Exception as exc:
            raise storage_error(f"save checkpoint {dir_name!r} to", target, exc) from exc

    def commit(
        self,
        dir_name: str,
        attempt: int,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None = None,
    ) -> str:
        """Make a checkpoint visible under its final name; returns the final path.

        Local: the staged directory is renamed into place. Elsewhere (and for NO_UPLOAD
        checkpoints) the parts are in place already; the snapshot entry is what commits them.
        """
        with storage_errors(f"commit checkpoint {dir_name!r} in", self.run_uri):
            return self._commit(dir_name, attempt, metadata, extra_files)

    def _commit(
        self,
        dir_name: str,
        attempt: int,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None,
    ) -> str:
        fs = self.filesystem
        staged, final = self.staging_path(dir_name, attempt), self.checkpoint_path(dir_name)
        if self.local and os.path.isdir(staged):
            if metadata:
                _merge_metadata(fs, staged, metadata)
            _write_files(fs, staged, extra_files)
            if os.path.exists(final):
                raise StorageError(
                    f"Checkpoint directory {final!r} already exists.\n"
                    "HINT: checkpoint_dir_name must be unique within a run."
                )
            _fsync_tree(staged)  # durable before visible; costs the driver, not training
            os.rename(staged, final)
            _fsync_dir(os.path.dirname(final))
            return final
        if not fs.exists(final):  # every part was empty
            fs.makedirs(final, exist_ok=True)
        if metadata:
            _merge_metadata(fs, final, metadata)
        _write_files(fs, final, extra_files)
        return final

    def delete_checkpoint(self, dir_name: str) -> None:
        path = self.checkpoint_path(dir_name)
        if self.local:
            shutil.rmtree(path, ignore_errors=True)
            return
        with storage_errors("delete checkpoint", path):
            if self.filesystem.exists(path):
                self.filesystem.rm(path, recursive=True)

    # -- small files ----------------------------------------------------------------------------

    def write_atomic(self, relative: str, data: bytes) -> None:
        """Write a small file so that readers see the old or the new content, never a mix."""
        final = self.path(relative)
        with storage_errors("write", final if self.local else self._uri(final)):
            if not self.local:
                with self.filesystem.open(final, "wb") as f:
                    f.write(data)
                return
            tmp = f"{final}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:  # a full disk, Ctrl-C: no half-written .tmp stays behind
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def read(self, relative: str) -> bytes | None:
        path = self.path(relative)
        with storage_errors("read", path if self.local else self._uri(path)):
            if not self.filesystem.exists(path):
                return None
            with self.filesystem.open(path, "rb") as f:
                return bytes(f.read())

    def _uri(self, path: str) -> str:
        """``path`` inside this storage as the user wrote it (``s3://bucket/...``)."""
        return self.run_uri + path[len(self.run_path) :]


def _write_files(fs: Any, directory: str, files: dict[str, bytes] | None) -> None:
    for name, data in (files or {}).items():
        with fs.open(f"{directory}/{name}", "wb") as f:
            f.write(data)


def _fsync_tree(root: str) -> None:
    """Flush every file and directory under ``root`` to disk (the files were written by ranks
    that did not fsync them; a power loss must not truncate a committed checkpoint)."""
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(directory)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _merge_metadata(fs: Any, directory: str, metadata: dict[str, Any]) -> None:
    path = f"{directory}/.metadata.json"
    merged = dict(metadata)
    if fs.exists(path):
        with fs.open(path, "r") as f:
            merged.update(json.load(f))
    with fs.open(path, "w") as f:
        json.dump(merged, f)
