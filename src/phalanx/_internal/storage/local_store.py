"""The store of a local (or shared POSIX) filesystem: stage, then one rename commits.

A rank stages its part under ``.staging/<dir_name>.<attempt>/`` (a move when the checkpoint is
on the same device, else a copy); the driver fsyncs the staged tree and renames it into place,
so a reader never sees a partial checkpoint and a committed one survives a power loss. Small
files are replaced with temp file + fsync + rename; logs and the snapshot's journal are appended
to; the run is claimed with ``flock``, which the kernel drops when the owner dies.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phalanx._foundation.fs import copy as local_copy
from phalanx._foundation.fs.access import (
    copy_tree,
    is_local,
    move_tree_contents,
    storage_error,
    storage_errors,
)
from phalanx._foundation.fs.syncfs import rename_no_replace, syncfs
from phalanx._internal.storage.claim import LOCK_FILE, Owner, locked_error
from phalanx._internal.storage.commit_record import (
    COMMIT_RECORDS_DIR,
    CommitRecord,
    record_file,
    remove_commit_record,
)
from phalanx._internal.storage.local_log import LocalLog, append_whole, fsync_path
from phalanx._internal.storage.run_storage import (
    IN_PLACE_SUFFIX,
    LOG_DIR,
    STAGING_DIR,
    RunStorage,
    merge_metadata,
    write_files,
)
from phalanx.errors import StorageError

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

logger = logging.getLogger(__name__)

FSYNC_THREADS = 8  # fsyncs of one commit in flight at once (every rank may pass a part)
# More files and directories than this in one commit: one syncfs(2) of the filesystem instead (a
# single-file checkpoint keeps its targeted fsync: syncfs also flushes what others wrote there).
SYNCFS_MIN_PATHS = 8


@dataclass(frozen=True)
class LocalStore(RunStorage, register=True):
    """A run on this machine's filesystem (see the module docstring)."""

    appends = True

    @classmethod
    def serves(cls, filesystem: object) -> bool:
        return is_local(filesystem)

    @property
    def local_path(self) -> str:
        return self.run_path

    @property
    def run_uri(self) -> str:
        return self.run_path

    def uri(self, path: str) -> str:
        return path

    def local_log_dir(self, create: bool = True) -> str:
        return self.path(LOG_DIR)

    # -- checkpoints ----------------------------------------------------------------------------

    def stage_part(
        self, source: Checkpoint, dir_name: str, attempt: int, move: bool = False
    ) -> None:
        """Put one rank's files into the staging directory of ``dir_name``: copied (the user's
        directory is theirs), unless ``move``: then a local directory on the same filesystem is
        moved entry by entry (a rename, no copy) and the emptied directory removed. Refused
        for an attempt that is not the run's current one (``check_attempt``)."""
        self.check_attempt(attempt, f"save checkpoint {dir_name!r} to")
        target = self.staging_path(dir_name, attempt)
        try:
            if is_local(source.filesystem):
                if move:
                    _move_dir(source.path, target)
                else:  # storage may live inside the checkpoint directory: never copy it
                    local_copy.copy_tree(source.path, target, exclude=self.storage_path)
            else:
                copy_tree(source.filesystem, source.path, self.filesystem, target)
        except Exception as exc:
            raise storage_error(f"save checkpoint {dir_name!r} to", target, exc) from exc

    def mark_in_place(self, dir_name: str, attempt: int) -> None:
        """The commit merges staged parts of other ranks into the in-place part instead of
        refusing an existing directory."""
        self.check_attempt(attempt, f"save checkpoint {dir_name!r} to")
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
        record: CommitRecord | None = None,
    ) -> str:
        """The staged directory is fsynced and renamed into place (NO_UPLOAD parts: merged).
        Refused for a stale attempt or driver (``check_attempt``)."""
        self.check_attempt(attempt, f"commit checkpoint {dir_name!r} in", driver=True)
        staged, final = self.staging_path(dir_name, attempt), self.checkpoint_path(dir_name)
        with storage_errors(f"commit checkpoint {dir_name!r} in", self.run_uri):
            if os.path.isdir(staged):
                return self._commit_staged(staged, final, metadata, extra_files, record)
            if not os.path.isdir(final):
                raise StorageError(
                    f"Checkpoint {dir_name!r} has no files: no rank's part reached {final!r}.\n"
                    "HINT: with checkpoint_upload_mode=NO_UPLOAD, write the files to "
                    "get_context().get_storage().build_checkpoint_path_from_name(name) first."
                )
            if metadata:
                merge_metadata(self.filesystem, final, metadata)
            write_files(self.filesystem, final, extra_files)
            _fsync_tree(final)
            self._write_record(record)
            return final

    def _commit_staged(
        self,
        staged: str,
        final: str,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None,
        record: CommitRecord | None,
    ) -> str:
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
            merge_metadata(self.filesystem, target, metadata)
        write_files(self.filesystem, target, extra_files)
        _fsync_tree(target)  # durable before visible; costs the driver, not training
        if not in_place:
            os.rename(staged, final)
            fsync_path(os.path.dirname(final))
        self._write_record(record)  # last: the checkpoint is whole and durable
        return final

    def _write_record(self, record: CommitRecord | None) -> None:
        if record is None:
            return
        # Whole (a temporary file renamed), not fsynced: the index entry written next is what
        # makes the commit durable; the record only has to come after the checkpoint's files
        # are (they are, above), so one that survives a crash always names a whole checkpoint,
        # and one a crash took leaves the directory to be set aside, never deleted.
        os.makedirs(self.path(COMMIT_RECORDS_DIR), exist_ok=True)
        _write_whole(self.path(record_file(record.dir_name)), record.encode(), durable=False)

    def delete_checkpoint(self, dir_name: str) -> None:
        self.refuse_if_not_owner(f"delete checkpoint {dir_name!r} of")
        remove_commit_record(self, dir_name)  # first: a record never outlives its files
        shutil.rmtree(self.checkpoint_path(dir_name), ignore_errors=True)

    def remove_staging(self) -> None:
        # A worker that is being torn down may still be writing here: never fail on it.
        self.refuse_if_not_owner("remove uncommitted checkpoint parts of")
        shutil.rmtree(self.path(STAGING_DIR), ignore_errors=True)

    def set_aside(self, dir_name: str, folder: str) -> str:
        """One rename: the directory moves whole, or not at all."""
        self.refuse_if_not_owner(f"move {dir_name!r} aside in")
        source, target = self.path(dir_name), self.path(folder, dir_name)
        with storage_errors(f"move {dir_name!r} aside to", target):
            os.makedirs(self.path(folder), exist_ok=True)
            os.rename(source, target)
            fsync_path(self.run_path)
        return target

    # -- small files and logs -------------------------------------------------------------------

    def write_atomic(self, relative: str, data: bytes) -> None:
        self.refuse_if_not_owner(f"write {relative!r} in")  # a driver that lost the run: nothing
        final = self.path(relative)
        with storage_errors("write", final):
            _write_whole(final, data, durable=True)
            fsync_path(os.path.dirname(final))  # the rename itself durable: the snapshot

    def remove(self, relative: str) -> None:
        self.refuse_if_not_owner(f"remove {relative!r} from")
        path = self.path(relative)
        with storage_errors("remove", path), contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def append_durable(self, relative: str, data: bytes) -> None:
        self.refuse_if_not_owner(f"append to {relative!r} in")
        append_whole(self.path(relative), data, durable=True)

    def open_log(self, relative: str) -> LocalLog:
        return LocalLog(self.path(relative))

    def read_log(self, relative: str) -> bytes:
        return self.read(relative) or b""

    # -- one owner at a time: an OS file lock ---------------------------------------------------

    def claim(self, owner: Owner, stale_s: float, settle_s: float) -> FileLock:
        return FileLock.take(self, owner)

    def claim_held(self) -> bool | None:
        return _file_lock_held(self.path(LOCK_FILE))


class FileLock:
    """``flock`` on ``<run>/.phalanx_lock``, which holds the owner for the loser's error."""

    def __init__(self, owner: Owner, fd: int | None) -> None:
        self.owner = owner
        self._fd = fd

    @classmethod
    def take(cls, storage: LocalStore, owner: Owner) -> FileLock:
        import fcntl

        path = storage.path(LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Owner.from_json(os.pread(fd, 4096, 0))
            os.close(fd)
            raise locked_error(storage.name, storage.run_uri, holder) from None
        except OSError as exc:  # a filesystem without locks (some network mounts): go on
            os.close(fd)
            logger.warning(
                "Cannot lock the run directory %r (%s): nothing stops another fit() from using "
                "it at the same time.",
                storage.run_path,
                exc,
            )
            return cls(owner, None)
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.to_json(), 0)
        return cls(owner, fd)

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _file_lock_held(path: str) -> bool | None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released at once by the close below
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


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
    with contextlib.suppress(OSError):  # keep a directory the user wrote to meanwhile
        os.rmdir(src)


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
            fsync_path(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    workers = min(FSYNC_THREADS, len(files) or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="phalanx-fsync") as pool:
        list(pool.map(fsync_path, files))  # list(): the first error is raised here
        list(pool.map(fsync_path, directories))  # the files' names, once the files are flushed


def _write_whole(final: str, data: bytes, durable: bool) -> None:
    """``final`` whole or untouched: written to ``final.tmp`` (fsynced when ``durable``), then
    renamed over it. A full disk or Ctrl-C on the way leaves no half-written ``.tmp`` behind."""
    tmp = f"{final}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
