"""The layout of one run in storage, and the two steps of a checkpoint: stage a part, commit.

::

    <storage_path>/<name>/
      checkpoint_manager_snapshot.json   committed checkpoints and their metrics (source of truth)
      .phalanx_snapshot_journal.jsonl    local: commits since the snapshot (snapshot_journal.py)
      .phalanx_history/                  object stores: metrics flushes (history_parts.py)
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
import errno
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

from phalanx._internal.storage import copy as local_copy
from phalanx._internal.storage.filesystem import (
    copy_tree,
    is_local,
    move_tree_contents,
    private_log_dir,
    resolve_filesystem,
    storage_error,
    storage_errors,
)
from phalanx._internal.storage.paths import (
    check_checkpoint_dir_name,
    component_problem,
    default_checkpoint_dir_name,
)
from phalanx._internal.storage.syncfs import rename_no_replace, syncfs
from phalanx.errors import StorageError

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
HISTORY_FILE = "metrics.jsonl"
ALL_RANKS_HISTORY_FILE = "metrics_all_ranks.jsonl"
STAGING_DIR = ".staging"
LOG_DIR = "logs"
ERROR_TEXT_FILE = "error.txt"
ERROR_PICKLE_FILE = "error.pkl"
MARKER_FILE = ".phalanx_run"
FSYNC_THREADS = 8  # fsyncs of one commit in flight at once (every rank may pass a part)
# More files and directories than this in one commit: one syncfs(2) of the filesystem instead (a
# single-file checkpoint keeps its targeted fsync: syncfs also flushes what others wrote there).
SYNCFS_MIN_PATHS = 8
IN_PLACE_SUFFIX = ".in_place"  # .staging/<dir_name>.<attempt>.in_place: a NO_UPLOAD part exists


@dataclass(frozen=True)
class RunStorage:
    """Where one run lives. Picklable: workers get a copy to stage their checkpoint parts."""

    filesystem: Any
    storage_path: str
    name: str

    def __post_init__(self) -> None:
        problem = component_problem(self.name)
        if problem is not None:  # the guard every path below relies on
            raise StorageError(
                f"Refusing the run name {self.name!r}: {problem}, so the run directory would "
                f"not be one directory inside {self.storage_path!r}.\n"
                "HINT: RunConfig(name=...) takes a plain directory name."
            )

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
        """A path inside the run directory; anything that would leave it is refused."""
        for part in parts:
            if any(c in ("", ".", "..") or "\\" in c for c in part.split("/")):
                raise StorageError(
                    f"Refusing to touch {part!r} in the run directory {self.run_path!r}: it is "
                    "not a plain name, so the path could point outside the run.\n"
                    "HINT: checkpoint names are single directory names such as 'epoch_3'."
                )
        return "/".join((self.run_path, *parts))

    def checkpoint_path(self, dir_name: str) -> str:
        return self.path(dir_name)

    def build_checkpoint_path_from_name(self, checkpoint_dir_name: str) -> str:
        """Where the checkpoint ``checkpoint_dir_name`` of this run lives (Ray's StorageContext
        method): write a ``NO_UPLOAD`` checkpoint there, then report it with that name."""
        return self.checkpoint_path(check_checkpoint_dir_name(checkpoint_dir_name))

    def make_default_checkpoint_dir_name(self) -> str:
        """The name this rank's next ``report()`` gives a checkpoint passed without
        ``checkpoint_dir_name`` (Ray's StorageContext method; call it in a training function).
        A ``NO_UPLOAD`` rank writes there so that other ranks' default-named parts join it."""
        from phalanx._internal.worker.session import require_session

        session = require_session("get_context().get_storage().make_default_checkpoint_dir_name")
        return default_checkpoint_dir_name(session.next_round)

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

    def stage_part(self, source: Any, dir_name: str, attempt: int, move: bool = False) -> None:
        """Put one rank's checkpoint files into the staging directory of ``dir_name``.

        ``source`` is a :class:`~phalanx.Checkpoint`. Its files are copied (the user's directory
        is theirs), unless ``move``: then a local directory on the same filesystem is moved entry
        by entry (a rename, no copy) and the emptied directory removed.
        """
        target = self.staging_path(dir_name, attempt) if self.local else self.path(dir_name)
        try:
            if self.local and is_local(source.filesystem):
                if move:
                    _move_dir(source.path, target)
                else:  # storage may live inside the checkpoint directory: never copy it
                    local_copy.copy_tree(source.path, target, exclude=self.storage_path)
            else:
                copy_tree(source.filesystem, source.path, self.filesystem, target)
                if move and is_local(source.filesystem):
                    shutil.rmtree(source.path)
        except Exception as exc:
            raise storage_error(f"save checkpoint {dir_name!r} to", target, exc) from exc

    def mark_in_place(self, dir_name: str, attempt: int) -> None:
        """A ``NO_UPLOAD`` part of ``dir_name`` lives in place: the commit merges staged parts of
        other ranks into it instead of refusing an existing directory."""
        if self.local:
            marker = self.staging_path(dir_name, attempt) + IN_PLACE_SUFFIX
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "a"):
                pass

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
            return self._commit_staged(staged, final, metadata, extra_files)
        if self.local and not os.path.isdir(final):
            raise StorageError(
                f"Checkpoint {dir_name!r} has no files: no rank's part reached {final!r}.\n"
                "HINT: with checkpoint_upload_mode=NO_UPLOAD, write the files to "
                "get_context().get_storage().build_checkpoint_path_from_name(name) first."
            )
        if not fs.exists(final):  # object stores: the NO_UPLOAD parts may be listed late
            fs.makedirs(final, exist_ok=True)
        if not fs.exists(final):  # an empty checkpoint on an object store: keep it readable
            fs.pipe(final.rstrip("/") + "/", b"")  # a directory marker, as S3 consoles write
        if metadata:
            _merge_metadata(fs, final, metadata)
        _write_files(fs, final, extra_files)
        return final

    def _commit_staged(
        self,
        staged: str,
        final: str,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None,
    ) -> str:
        fs = self.filesystem
        in_place = os.path.exists(final)
        if in_place and not os.path.exists(staged + IN_PLACE_SUFFIX):
            raise StorageError(
                f"Checkpoint directory {final!r} already exists.\n"
                "HINT: checkpoint_dir_name must be unique within a run."
            )
        if in_place:  # NO_UPLOAD ranks wrote their part there: the others' parts join it
            move_tree_contents(staged, final)
            os.rmdir(staged)
        target = final if in_place else staged
        if metadata:
            _merge_metadata(fs, target, metadata)
        _write_files(fs, target, extra_files)
        _fsync_tree(target)  # durable before visible; costs the driver, not training
        if not in_place:
            os.rename(staged, final)
        _fsync_dir(os.path.dirname(final))
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


def _move_dir(src: str, dst: str) -> None:
    """Move the directory ``src`` to ``dst``: one rename when ``dst`` is free (metadata only:
    no mkdir, no rmdir), else entry by entry into the part another rank started there."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.islink(src):
        try:  # never onto another rank's (maybe still empty) part: that would replace it
            if rename_no_replace(src, dst):
                return
        except OSError as exc:  # taken by another rank's part, another device, a mount point
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EXDEV, errno.EBUSY):
                raise
    os.makedirs(dst, exist_ok=True)  # without renameat2: join the directory, never replace it
    move_tree_contents(src, dst)
    _remove_if_empty(src)


def _remove_if_empty(path: str) -> None:
    """Remove a directory the user let us empty; keep it if they wrote to it meanwhile."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def _write_files(fs: Any, directory: str, files: dict[str, bytes] | None) -> None:
    for name, data in (files or {}).items():
        with fs.open(f"{directory}/{name}", "wb") as f:
            f.write(data)


def _fsync_tree(root: str) -> None:
    """Flush every file and directory under ``root`` to disk (the files were written by ranks
    that did not fsync them; a power loss must not truncate a committed checkpoint).

    With every rank passing a part, one after another the fsyncs cost the commit O(parts) disk
    round trips: many paths are flushed with one ``syncfs`` where it reports write errors
    (``storage/syncfs.py``), else in a few threads so the filesystem flushes them together. Every
    flush is done (or its error raised) before this returns, so the caller's rename still follows
    durability.
    """
    files: list[str] = []
    directories: list[str] = []
    for directory, _, names in os.walk(root):
        files.extend(os.path.join(directory, name) for name in names)
        directories.append(directory)
    paths = files + directories
    if len(paths) > SYNCFS_MIN_PATHS and syncfs(root):  # one flush for them all
        return
    if len(paths) <= 2:
        for path in paths:
            _fsync_path(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    workers = min(FSYNC_THREADS, len(files) or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="phalanx-fsync") as pool:
        list(pool.map(_fsync_path, files))  # list(): the first error is raised here
        list(pool.map(_fsync_path, directories))  # the files' names, once the files are flushed


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
