"""Persisting a rank's checkpoint part: sync, async (a background thread), or already in place.

The directory a user reports is theirs (Ray's contract). ``SYNC`` copies its files into storage
and leaves it exactly as it was. Files are moved (a rename, no copy) only when the user allows
it with ``delete_local_checkpoint_after_upload=True``, the default for ``ASYNC``; the directory
is then removed once its files are safe. ``ASYNC`` with ``delete_local_checkpoint_after_upload=
False`` reads the directory in the background: it must stay unchanged until the upload is done
(the next ``report()`` with a checkpoint, or the end of the training function, waits for it).

One thread uploads parts in report order and sends each report once its part is durable.
Reports without a checkpoint queue behind pending uploads, so the driver still sees reports in
order, and never wait. At most one upload is outstanding: the next checkpoint waits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from queue import SimpleQueue

from phalanx._foundation.fs.access import move_tree_contents
from phalanx._foundation.fs.paths import checkpoint_name_problem
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.report_extras import Wire
from phalanx._internal.worker.runtime import Outbox
from phalanx.checkpoint import Checkpoint
from phalanx.errors import StorageError


def check_source(checkpoint: Checkpoint, local: bool) -> None:
    """A reported checkpoint must be a directory (``local``: on this machine's disk). An empty
    one is a checkpoint, as in Ray (its fault-tolerance guide reports a ``TemporaryDirectory``
    with the save left as a comment)."""
    fs, path = checkpoint.filesystem, checkpoint.path
    if not (os.path.isdir(path) if local else fs.isdir(path)):
        raise FileNotFoundError(
            f"report(checkpoint=...) was given {path!r}, which is not a directory (missing, or "
            "a file). A checkpoint is a directory of files.\nHINT: write your files into a "
            "directory first, then pass Checkpoint.from_directory(that_directory)."
        )


def check_deletable(storage: RunStorage, local_path: str) -> None:
    """``delete_local_checkpoint_after_upload=True`` removes the local directory: refuse
    directories that hold the run itself (as Ray does) or that other programs share."""
    path = os.path.realpath(local_path)
    shared = {os.path.realpath(p) for p in (tempfile.gettempdir(), os.path.expanduser("~"))}
    shared |= {os.path.realpath(os.getcwd()), "/"}
    run = os.path.realpath(storage.local_path) if storage.local_path else None
    inside = run is not None and (run == path or run.startswith(path.rstrip("/") + "/"))
    if path in shared or inside:
        what = "holds the run directory " + repr(run) if inside else "is shared with others"
        raise ValueError(
            f"report(checkpoint={path!r}) with delete_local_checkpoint_after_upload=True (the "
            f"default for ASYNC) would remove that directory, and it {what}.\nHINT: write the "
            "checkpoint into a directory of its own (tempfile.mkdtemp()), or pass "
            "delete_local_checkpoint_after_upload=False."
        )


def in_place_dir_name(
    storage: RunStorage, checkpoint: Checkpoint, checkpoint_dir_name: str | None
) -> str:
    """NO_UPLOAD: the checkpoint must already be a directory directly inside the run directory."""
    run_path = storage.run_path.rstrip("/")
    path = checkpoint.path.rstrip("/")
    same_fs = type(checkpoint.filesystem) is type(storage.filesystem)
    name = os.path.basename(path)
    if not same_fs or os.path.dirname(path) != run_path or checkpoint_name_problem(name):
        raise ValueError(
            f"checkpoint_upload_mode=NO_UPLOAD needs a checkpoint directly inside the run "
            f"directory {run_path!r}, got {path!r}.\nHINT: write it to "
            "phalanx.get_context().get_storage().build_checkpoint_path_from_name(name), or use "
            "SYNC."
        )
    if checkpoint_dir_name is not None and checkpoint_dir_name != name:
        raise ValueError(
            f"checkpoint_upload_mode=NO_UPLOAD: the checkpoint is the directory {name!r}, but "
            f"checkpoint_dir_name={checkpoint_dir_name!r}.\nHINT: write the files to "
            "get_context().get_storage().build_checkpoint_path_from_name(checkpoint_dir_name)."
        )
    return name


def same_device(local_path: str, storage: RunStorage) -> bool:
    """Whether a rename can carry a local checkpoint's files into the run's staging area."""
    if storage.local_path is None:
        return False
    try:
        return os.stat(local_path).st_dev == os.stat(storage.run_path).st_dev
    except OSError:
        return False


def move_aside(checkpoint: Checkpoint) -> str:
    """Move a local checkpoint's files into a new private directory next to it (a rename on
    the same filesystem) and remove the emptied directory; return the private directory."""
    parent = os.path.dirname(checkpoint.path.rstrip("/"))
    if not os.path.islink(checkpoint.path):  # one rename of the whole directory, when allowed
        private = os.path.join(parent, f".phalanx-upload-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(checkpoint.path, private)
            return private
        except OSError:
            pass  # a read-only parent, a mount point: move the entries instead
    try:
        private = tempfile.mkdtemp(prefix=".phalanx-upload-", dir=parent)
    except OSError:
        private = tempfile.mkdtemp(prefix="phalanx-upload-")
    move_tree_contents(checkpoint.path, private)
    try:
        os.rmdir(checkpoint.path)
    except OSError:
        pass  # written to meanwhile, or removed: leave it to its owner
    return private


class BackgroundUploader:
    """One thread per worker that uploads parts and sends reports, strictly in order."""

    def __init__(self, storage: RunStorage, attempt: int, outbox: Outbox) -> None:
        self._storage = storage
        self._attempt = attempt
        self._outbox = outbox
        self._tasks: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._upload_done = threading.Event()
        self._upload_done.set()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def send(self, message: Wire) -> None:
        """Queue a report behind pending uploads."""
        self._submit(lambda: self._outbox.send(message))

    def reserve(self) -> float:
        """Wait until the previous upload of a user's directory is done (at most one is
        outstanding), then hold the slot for the next one, which ``upload(..., prepare=None)``
        must follow at once; returns the seconds waited (0.0: too short to tell, nothing to
        wait for). save_state's private directories take
        no slot: its own max_pending bounds them."""
        waiting = time.perf_counter()
        self._upload_done.wait()
        waited = time.perf_counter() - waiting
        waited = waited if waited >= 1e-4 else 0.0
        self.raise_error()
        self._upload_done.clear()
        return waited

    def upload(
        self,
        source: Checkpoint,
        dir_name: str,
        message: Wire,
        scratch: bool,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        """Persist ``source`` as this rank's part of ``dir_name``, then send ``message``.

        ``scratch``: ``source`` is phalanx's private directory (moved aside): its files are
        moved when possible and it is removed afterwards. Otherwise it is the user's and is
        only read. ``prepare`` runs first on the upload thread (``save_state``: wait until the
        files are written; its error fails the upload, so the round never commits). Without
        ``prepare`` the slot was taken by ``reserve()``, and the upload frees it.
        """
        tracked = prepare is None
        if not tracked:
            self.raise_error()

        def task() -> None:
            try:
                if prepare is not None:
                    prepare()
                self._storage.stage_part(source, dir_name, self._attempt, move=scratch)
                self._outbox.send(message)
            finally:
                if scratch:
                    shutil.rmtree(source.path, ignore_errors=True)
                if tracked:
                    self._upload_done.set()

        self._submit(task)

    def _submit(self, task: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="phalanx-upload", daemon=True)
            self._thread.start()
        with self._idle:
            self._pending += 1
        self._tasks.put(task)

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                if self.error is None:
                    task()
            except BaseException as exc:
                self.error = exc
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, StorageError):
                raise error
            raise StorageError(f"A background checkpoint upload failed: {error}") from error

    def wait(self) -> None:
        """Block until every queued upload and report is done; raise an upload's error."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)
        self.raise_error()

    def close(self) -> None:
        if self._thread is not None:
            self._tasks.put(None)
            self._thread.join()
            self._thread = None
