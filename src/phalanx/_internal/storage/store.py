"""The store contract: everything storage offers the rest of phalanx, in one protocol.

A store is where one run lives (``<storage_path>/<name>``) together with the durability rules of
the filesystem that holds it. Two ship with phalanx:

- :class:`~.local_store.LocalStore` (a local or shared POSIX filesystem): parts are staged under
  ``.staging/`` and a commit is one rename; the snapshot gets an appended journal; history files
  are appended to (a line cut by a crash is cut off again at the next start); the run is claimed
  with ``flock``; a commit is made durable with ``fsync``/``syncfs`` before it is visible.
- :class:`~.object_store.ObjectStore` (S3, GCS, ``memory://``, anything fsspec opens): no rename,
  so parts are written at the final prefix and the snapshot listing a checkpoint is its commit;
  history flushes are part objects, folded now and then; the run is claimed with a lease object
  and a heartbeat.

The checkpoint manager, the history, the run lock, the run record, the run status and the
reader are written against this protocol only. Adding a store is one module with a subclass of
:class:`~.run_storage.RunStorage` that implements it (``register=True`` and ``serves`` to have
``RunStorage(filesystem, ...)`` choose it) and one ``StoreCase`` in ``tests/storage/contract``.
What every store must do is what that suite checks: a checkpoint is visible whole or not at all
whichever step a kill lands between, retention removes what it drops, the snapshot's changes
survive a restart, a history line is read back once and a cut one repaired, one owner at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from phalanx._internal.storage.claim import Owner
    from phalanx._internal.storage.commit_record import CommitRecord
    from phalanx.checkpoint import Checkpoint


class RunLog(Protocol):
    """One append-only file of the run (``metrics.jsonl``...), written by its owner only."""

    def repair(self) -> int:
        """Drop a partial last line left by a crash; returns how many bytes were cut."""
        ...

    def append(self, data: bytes) -> None:
        """Add whole lines: all of ``data`` or none of it."""
        ...

    def read(self) -> bytes:
        """Everything appended so far (after ``repair``)."""
        ...

    def count_lines(self) -> int:
        """Non-empty lines so far, without holding the file in memory where it can be avoided."""
        ...

    def compact(self) -> None:
        """Leave the log as one whole file (the end of ``fit()``)."""
        ...


class RunClaim(Protocol):
    """A run held by one owner; ``release`` lets the next one in."""

    owner: Owner

    def release(self) -> None: ...


class RunStore(Protocol):
    """Everything the rest of phalanx may do to a run's storage (see the module docstring)."""

    @property
    def filesystem(self) -> Any:
        """The fsspec filesystem holding the run."""
        ...

    @property
    def storage_path(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def appends(self) -> bool:
        """Files grow in place and are readable at once (the snapshot's journal works)."""
        ...

    @property
    def run_path(self) -> str: ...

    @property
    def run_uri(self) -> str: ...

    @property
    def local_path(self) -> str | None:
        """The run directory on this machine (None on remote storage)."""
        ...

    def path(self, *parts: str) -> str: ...

    def uri(self, path: str) -> str: ...

    def checkpoint_path(self, dir_name: str) -> str: ...

    def local_log_dir(self, create: bool = True) -> str:
        """Where the ranks' logs are written on this machine (``create=False``: for readers)."""
        ...

    # -- checkpoints ----------------------------------------------------------------------------

    def stage_part(
        self, source: Checkpoint, dir_name: str, attempt: int, move: bool = False
    ) -> None:
        """Put one rank's files (a :class:`~phalanx.Checkpoint`) where ``commit`` finds them."""
        ...

    def mark_in_place(self, dir_name: str, attempt: int) -> None:
        """A ``NO_UPLOAD`` part already lives at the checkpoint's final path."""
        ...

    def commit(
        self,
        dir_name: str,
        attempt: int,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None = None,
        record: CommitRecord | None = None,
    ) -> str:
        """Make the staged parts the checkpoint ``dir_name``, durable; returns its path.
        ``record`` (``commit_record.py``) is written last, once the checkpoint is whole."""
        ...

    def delete_checkpoint(self, dir_name: str) -> None:
        """Its commit record first, then its files (a record never outlives them)."""
        ...

    def staged_names(self) -> set[str]:
        """The checkpoint names that have a part staged for a commit that has not happened (a
        ``NO_UPLOAD`` part in place, on an object store a part at the final prefix, included)."""
        ...

    def remove_staging(self) -> None:
        """Drop parts that were never committed (a failed or cut-off attempt)."""
        ...

    def set_aside(self, dir_name: str, folder: str) -> str:
        """Move the directory ``dir_name`` of the run into the run's ``folder`` (made if
        needed), never deleting it; returns where it went."""
        ...

    # -- small files and logs -------------------------------------------------------------------

    def write_atomic(self, relative: str, data: bytes) -> None:
        """Readers see the old content or the new, never a mix."""
        ...

    def read(self, relative: str) -> bytes | None: ...

    def remove(self, relative: str) -> None: ...

    def append_durable(self, relative: str, data: bytes) -> None:
        """Append whole lines, durable on return (stores with ``appends`` only)."""
        ...

    def open_log(self, relative: str) -> RunLog:
        """The log ``relative`` for its owner to repair, append to and read back."""
        ...

    def read_log(self, relative: str) -> bytes:
        """A log as a reader sees it (b"" when there is none)."""
        ...

    # -- fencing (run_storage.py's docstring) ----------------------------------------------------

    def begin_attempt(self, attempt: int) -> None:
        """The driver: ``attempt`` is the run's current one; earlier attempts' writes refused."""
        ...

    def check_attempt(self, attempt: int, action: str, driver: bool = False) -> None:
        """Raise StaleAttemptError unless ``attempt`` of this driver is the current one."""
        ...

    def check_owner(self, action: str) -> tuple[str, int] | None:
        """Raise StaleAttemptError if another driver took the run over; the current attempt."""
        ...

    # -- one owner at a time --------------------------------------------------------------------

    def claim(self, owner: Owner, stale_s: float, settle_s: float) -> RunClaim:
        """Hold the run for ``owner``, or raise StorageError naming the owner that holds it."""
        ...

    def claim_held(self) -> bool | None:
        """Whether some owner holds the run now (None: this store cannot tell)."""
        ...
