"""Persisting a rank's checkpoint parts: sync, async (a background thread), or already in place.

In async mode ``report()`` first moves the checkpoint's files into a private directory next to
them (a rename: the user's temporary directory may vanish right after ``report()`` returns),
then returns; one thread uploads parts in report order and sends each report once its part is
durable. Reports without a checkpoint queue behind pending uploads, so the driver still sees
reports in order, and never wait. At most one upload is outstanding: the next checkpoint waits.
"""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from phalanx._internal.storage.filesystem import is_local, move_tree_contents
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.runtime import Outbox
from phalanx.checkpoint import Checkpoint
from phalanx.errors import StorageError


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` persists a checkpoint (Ray Train's ``checkpoint_upload_mode``)."""

    SYNC = "sync"  # persisted before report() returns
    ASYNC = "async"  # report() returns at once; persisted in the background, in order
    NO_UPLOAD = "no_upload"  # the checkpoint was written inside the run directory already


def private_copy(checkpoint: Checkpoint) -> str:
    """Move a local checkpoint's files into a new private directory (rename when possible)."""
    parent = os.path.dirname(checkpoint.path.rstrip("/"))
    try:
        private = tempfile.mkdtemp(prefix=".phalanx-upload-", dir=parent)
    except OSError:
        private = tempfile.mkdtemp(prefix="phalanx-upload-")
    move_tree_contents(checkpoint.path, private)
    return private


def in_place_dir_name(storage: RunStorage, checkpoint: Checkpoint) -> str:
    """NO_UPLOAD: the checkpoint must already be a directory directly inside the run directory."""
    run_path = storage.run_path.rstrip("/")
    path = checkpoint.path.rstrip("/")
    same_fs = type(checkpoint.filesystem) is type(storage.filesystem)
    if not same_fs or os.path.dirname(path) != run_path:
        raise ValueError(
            f"checkpoint_upload_mode=NO_UPLOAD needs a checkpoint directly inside the run "
            f"directory {run_path!r}, got {path!r}.\nHINT: write it to "
            "os.path.join(phalanx.get_context().get_storage().run_path, name), or use SYNC."
        )
    return os.path.basename(path)


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

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue a report behind pending uploads."""
        self._submit(lambda: self._outbox.send(message))

    def upload(self, private_dir: str, dir_name: str, message: tuple[Any, ...]) -> None:
        """Persist ``private_dir`` as this rank's part of ``dir_name``, then send ``message``."""
        self._upload_done.wait()  # at most one outstanding upload
        self.raise_error()
        self._upload_done.clear()

        def task() -> None:
            try:
                source = Checkpoint(private_dir)
                self._storage.stage_part(source, dir_name, self._attempt)
                self._outbox.send(message)
            finally:
                shutil.rmtree(private_dir, ignore_errors=True)
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


def delete_local(checkpoint: Checkpoint) -> None:
    if is_local(checkpoint.filesystem):
        shutil.rmtree(checkpoint.path, ignore_errors=True)
