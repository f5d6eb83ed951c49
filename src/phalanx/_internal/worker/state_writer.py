"""The background writer behind ``phalanx.torch.save_state``: one thread per worker session.

``save_state`` copies the training state into a reused snapshot (the part that must block:
the next optimizer step overwrites the tensors), then queues a :class:`WriteJob` here. The
thread writes the files into a private directory of the run's staging area while training
goes on. ``report(checkpoint=...)`` finds the job by the checkpoint's path
(:func:`pending_write`) and lets the uploader commit the part once the job is done, so a round
commits only when every rank's files are complete; a worker killed mid-write never commits.

At most ``slots`` snapshots exist: :meth:`StateWriter.slot` waits for the write that last
used a slot before it is filled again, and says so once per session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue

from phalanx.errors import StorageError

logger = logging.getLogger(__name__)

_pending: dict[str, WriteJob] = {}  # checkpoint path -> its write, until report() takes it
_pending_lock = threading.Lock()


class WriteJob:
    """One snapshot being written; :meth:`result` waits for it and raises its error."""

    def __init__(self, path: str, write: Callable[[], None], blocking: bool) -> None:
        self.path = path
        self.blocking = blocking
        self._write = write
        self._done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:
            self.error = exc
        finally:
            self._write = _nothing  # drop the snapshot's references
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise StorageError(
                f"phalanx.torch.save_state could not write the checkpoint files into "
                f"{self.path!r}: {type(self.error).__name__}: {self.error}. The disk may be full "
                "or the state may hold a value that cannot be serialised.\nHINT: check the "
                "error above; the round of this checkpoint was not committed."
            ) from self.error


def _nothing() -> None:
    return None


def pending_write(path: str) -> WriteJob | None:
    """The write of a ``save_state`` checkpoint at ``path``, taken once (None for others)."""
    with _pending_lock:
        return _pending.pop(path.rstrip("/"), None)


class StateWriter:
    """Writes snapshots in the order they were taken, on one daemon thread."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._jobs: SimpleQueue[WriteJob | None] = SimpleQueue()
        self._slot_jobs: dict[int, WriteJob] = {}
        self._all: list[WriteJob] = []
        self._warned = False
        self._thread: threading.Thread | None = None

    def slot(self, index: int) -> None:
        """Wait until the write that last used snapshot slot ``index`` is done."""
        job = self._slot_jobs.get(index % self.slots)
        if job is not None and not job.done():
            if not self._warned:
                self._warned = True
                logger.warning(
                    "save_state waits for the previous checkpoint's background write "
                    "(max_pending=%d snapshots in memory): checkpoints are written more slowly "
                    "than they are taken. Later waits are not logged.",
                    self.slots,
                )
            job.result()

    def submit(self, index: int, job: WriteJob) -> None:
        self._slot_jobs[index % self.slots] = job
        self._all = [j for j in self._all if not j.done()] + [job]
        with _pending_lock:
            _pending[job.path.rstrip("/")] = job
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="phalanx-state", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run()

    def busy(self) -> bool:
        """A snapshot is still being written (the step-time benchmark asks between steps)."""
        return any(not job.done() for job in self._all)

    def wait_all(self) -> None:
        """Wait until every queued write is done (errors stay for :meth:`raise_error`)."""
        for job in list(self._all):
            job._done.wait()

    def raise_error(self) -> None:
        """Raise the error of a finished write (the run fails through the usual path)."""
        for job in self._all:
            if job.done() and job.error is not None:
                job.result()

    def close(self) -> None:
        """Wait for every queued write; raise the first write's error."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        with _pending_lock:
            for job in self._all:
                _pending.pop(job.path.rstrip("/"), None)
        jobs, self._all = self._all, []
        for job in jobs:
            job.result()
