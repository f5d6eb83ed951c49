"""The layout of one run in storage, and what every store shares; the stores themselves are
:mod:`local_store` (a local or shared POSIX filesystem) and :mod:`object_store` (S3, GCS, ...).

::

    <storage_path>/<name>/
      checkpoint_manager_snapshot.json   committed checkpoints and their metrics (source of truth)
      .phalanx_snapshot_journal.jsonl    stores that append: commits since the snapshot
      .phalanx_history/                  stores that cannot append: metrics flushes
      metrics.jsonl                      every round: rank 0's metrics (+ training_iteration, ...)
      metrics_all_ranks.jsonl            every report of every rank
      checkpoint_000004/                 committed checkpoints (or a user checkpoint_dir_name)
      .phalanx_commits/<dir_name>.json   each one's commit record, written last (commit_record.py)
      .staging/<dir_name>.<attempt>/     parts being written; renamed into place on commit
      .phalanx_attempt.json              the current attempt: its driver's token and index
      orphaned_<time>/                   directories set aside, never deleted (see below)
      logs/rank_<r>.log                  each rank's stdout and stderr
      error.txt, error.pkl               the failure, if the run failed

A part is staged by the rank that owns the files; the driver commits once every participating
rank's part is durable. ``RunStorage(filesystem, storage_path, name)`` gives the store that
serves ``filesystem``: the surface every store offers is :class:`~.store.RunStore`.

What phalanx ever deletes or moves in a run directory, and the one rule that allows each:

- an evicted checkpoint, deleted after the index that drops it is durable: retention
  (``CheckpointConfig.num_to_keep``), and only retention (``CheckpointManager._apply_retention``);
- a checkpoint whose index entry could not be written (the commit failed), at once;
- staged parts of a round that never committed (``.staging/``, a ``NO_UPLOAD`` part in place, an
  object store's parts named by a staging marker), when the attempt ends and when the run resumes;
- a directory named like a checkpoint that the index does not know and that has no commit record
  naming it (a commit cut off before its record, files written there by hand): moved into
  ``orphaned_<time>/`` with a WARNING, never deleted; one with a record is re-indexed;
- after a ``fit()`` that failed on a configuration error before any commit, its run files are set
  aside in ``config_error_<time>/`` (``run_record.start_afresh_after_config_error``);
- the snapshot's journal, once a compaction's snapshot holding all of it is durable;
- a history line cut by a crash mid-write, and history parts once folded into the whole file;
- temp files of an atomic write that failed.

``tests/storage/test_deletion_rules.py`` holds each rule: it fails when one is loosened.

Fencing: every write into a run carries its attempt. A store holds its driver's token
(``owner``, one per ``fit()``: the run's claim, lock or lease, is taken with it) and pickled
copies carry it to the workers; the driver names the current attempt in ``.phalanx_attempt.json``
(``begin_attempt``) before it starts one, refused once another driver holds the run's lease. A
staged part (``stage_part``, ``mark_in_place``) and a commit name their attempt, and a store
refuses them (:class:`StaleAttemptError`, nothing written) unless it is the current one of the
current driver (``check_attempt``): a worker left over from an earlier attempt (its host cut
off, then back) or a driver whose lease another took over writes nothing into the run. On an
object store a part is uploaded to the final prefix: it is checked before and after the upload,
so a stale upload that was in flight when the attempt moved on is never reported as staged; what
such an upload wrote is not fenced off by the store itself (an object store has no rename to
stage it apart): the worker's fence (``worker/fence.py``) stops it within its bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from phalanx._foundation.fs.access import resolve_filesystem, storage_errors
from phalanx._foundation.fs.paths import check_checkpoint_dir_name, component_problem
from phalanx._internal.storage.claim import LEASE_FILE
from phalanx._internal.storage.lease import RENEWALS_MISSED_S, lease_silence_s
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
HISTORY_FILE = "metrics.jsonl"
ALL_RANKS_HISTORY_FILE = "metrics_all_ranks.jsonl"
STAGING_DIR = ".staging"
LOG_DIR = "logs"
ERROR_TEXT_FILE = "error.txt"
ERROR_PICKLE_FILE = "error.pkl"
MARKER_FILE = ".phalanx_run"
ORPHANED_PREFIX = "orphaned_"
IN_PLACE_SUFFIX = ".in_place"  # .staging/<dir_name>.<attempt>.in_place: a NO_UPLOAD part exists
ATTEMPT_FILE = ".phalanx_attempt.json"

_STORES: list[type[RunStorage]] = []  # chosen in order: the first that serves the filesystem


class Fencing(TypedDict, total=False):
    """One driver's fencing state (its store's, shared by the copies it makes)."""

    began: bool  # it began an attempt
    deposed: str  # why it lost the run (another driver took it over): every write is refused
    etags: dict[str, str | None]  # S3: the version of each run file it wrote or read last


@dataclass(frozen=True)
class RunStorage(RunStore):
    """Where one run lives. Picklable: workers get a copy to stage their checkpoint parts.

    ``RunStorage(fs, storage_path, name)`` returns the store for ``fs`` (a subclass registered
    with ``serves``); a subclass named directly is used as it is (the contract suite's toy store).
    """

    # Defaults only so that these fields, not the protocol's read-only properties, are looked up.
    filesystem: Any = None
    storage_path: str = ""
    name: str = ""
    # This driver's token (see the module docstring); copies sent to workers keep it
    owner: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)
    # This driver's fencing state (see Fencing)
    fencing: Fencing = field(default_factory=lambda: Fencing(), compare=False, repr=False)

    appends: ClassVar[bool] = False
    """Files grow in place (history lines, the snapshot's journal), readable at once."""

    def __new__(cls, *args: object, **kwargs: object) -> RunStorage:
        if cls is RunStorage:
            filesystem = args[0] if args else kwargs.get("filesystem")
            cls = next(s for s in _STORES if s.serves(filesystem))
        return object.__new__(cls)

    def __init_subclass__(cls, register: bool = False, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if register:
            _STORES.append(cls)

    def __post_init__(self) -> None:
        problem = component_problem(self.name)
        if problem is not None:  # the guard every path below relies on
            raise StorageError(
                f"Refusing the run name {self.name!r}: {problem}, so the run directory would "
                f"not be one directory inside {self.storage_path!r}.\n"
                "HINT: RunConfig(name=...) takes a plain directory name."
            )

    @classmethod
    def serves(cls, filesystem: object) -> bool:
        return False

    @classmethod
    def create(cls, storage_path: str, name: str, filesystem: object = None) -> RunStorage:
        with storage_errors("open the storage at", os.fspath(storage_path)):
            fs, root = resolve_filesystem(storage_path, filesystem)
        return cls(fs, root.rstrip("/") or "/", name)

    # -- layout ---------------------------------------------------------------------------------

    @property
    def run_path(self) -> str:
        return f"{self.storage_path.rstrip('/')}/{self.name}"  # the root: /name, not //name

    @property
    def local_path(self) -> str | None:
        """The run directory as a path of this machine's filesystem; None on remote storage."""
        return None

    @property
    def run_uri(self) -> str:
        """The run directory as a path (local) or URI (``s3://bucket/...``)."""
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

    def uri(self, path: str) -> str:
        """``path`` inside this storage as the user wrote it (``s3://bucket/...``)."""
        return self.run_uri + path[len(self.run_path) :]

    def checkpoint_path(self, dir_name: str) -> str:
        return self.path(dir_name)

    def build_checkpoint_path_from_name(self, checkpoint_dir_name: str) -> str:
        """Where the checkpoint ``checkpoint_dir_name`` of this run lives."""
        return self.checkpoint_path(check_checkpoint_dir_name(checkpoint_dir_name))

    def staging_path(self, dir_name: str, attempt: int) -> str:
        return self.path(STAGING_DIR, f"{dir_name}.{attempt}")

    # -- what every store shares ----------------------------------------------------------------

    def prepare(self) -> None:
        """Create the run directory and prove it is writable. Leftovers of cut-off commits are
        for ``CheckpointManager.recover_unindexed`` to sort out: it needs the staging records."""
        fs = self.filesystem
        with storage_errors("write to the run directory", self.run_uri):
            fs.makedirs(self.run_path, exist_ok=True)
            with fs.open(self.path(MARKER_FILE), "w") as f:
                f.write("phalanx run directory\n")

    def staged_names(self) -> set[str]:
        """Names under ``.staging/``: ``<dir_name>.<attempt>`` and its ``.in_place`` marker."""
        staging = self.path(STAGING_DIR)
        with storage_errors("list", self.uri(staging)):
            if not self.filesystem.exists(staging):
                return set()
            listing = self.filesystem.ls(staging, detail=False)
        names = set()
        for entry in listing:
            name = entry.rstrip("/").rsplit("/", 1)[-1].removesuffix(IN_PLACE_SUFFIX)
            base, dot, attempt = name.rpartition(".")
            if dot and attempt.isdigit():
                names.add(base)
        return names

    def set_aside(self, dir_name: str, folder: str) -> str:
        """Object by object (no rename here): every object is copied before any is removed."""
        self.refuse_if_not_owner(f"move {dir_name!r} aside in")
        source, target = self.path(dir_name), self.path(folder, dir_name)
        fs = self.filesystem
        with storage_errors(f"move {dir_name!r} aside to", self.uri(target)):
            objects = fs.find(source)
            for path in objects:
                fs.copy(path, target + path[len(source) :])
            if objects:
                fs.rm(objects)
            if fs.exists(source):  # a directory marker
                fs.rm(source, recursive=True)
        return self.uri(target)

    # -- fencing: the current attempt -----------------------------------------------------------

    def begin_attempt(self, attempt: int) -> None:
        """The driver: ``attempt`` is the run's current attempt from now on; earlier attempts'
        parts and commits are refused. Refused itself once another driver holds the run."""
        self.check_owner(f"start attempt {attempt} of")
        stamp = {"owner": self.owner, "attempt": attempt}
        self.write_atomic(ATTEMPT_FILE, json.dumps(stamp).encode())
        self.fencing["began"] = True

    def check_attempt(self, attempt: int, action: str, driver: bool = False) -> None:
        """Raise :class:`StaleAttemptError` unless ``attempt`` of this store's driver is the
        run's current one (a run no driver began an attempt of accepts any). ``driver``: the
        driver's own write (a commit) also needs the run's lease to be its own."""
        now = self.check_owner(action) if driver else self._current_attempt()
        if now is not None and now != (self.owner, attempt):
            other = "this driver's" if now[0] == self.owner else "another driver's"
            raise StaleAttemptError(
                f"Refused to {action} run {self.name!r} for attempt {attempt}: the run's "
                f"current attempt is {other} attempt {now[1]} ({self.uri(self.path(ATTEMPT_FILE))}"
                "). This worker or driver was given up (its host cut off, or its driver "
                "gone), and another attempt owns the run now.\n"
                "HINT: nothing to do: the current attempt trains on; this process should stop."
            )

    def check_owner(self, action: str) -> tuple[str, int] | None:
        """Raise :class:`StaleAttemptError` if another driver took the run over: it holds the
        run's lease now, or it began an attempt since this driver did (its lease released at
        its end). This store then refuses every later write (``refuse_if_deposed``). Returns the
        run's current attempt (None: none begun)."""
        self.refuse_if_deposed(action)
        raw = self.read(LEASE_FILE)  # local stores hold the run with flock: no lease there
        token = None
        if raw is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                token = str(json.loads(raw)["token"])
        if token is not None and token != self.owner:
            self.depose(
                f"another fit() holds the run's lease now ({self.uri(self.path(LEASE_FILE))}): "
                "it took the run over while this driver was silent (its host cut off or frozen "
                "past the lease's stale bound)"
            )
        now = self._current_attempt()
        if self.fencing.get("began") and now is not None and now[0] != self.owner:
            self.depose(
                f"another fit() began attempt {now[1]} of this run since this driver's last "
                f"({self.uri(self.path(ATTEMPT_FILE))}): it took the run over while this driver "
                "was silent (its host cut off or frozen past the lease's stale bound)"
            )
        self.refuse_if_deposed(action)
        return now

    def _current_attempt(self) -> tuple[str, int] | None:
        raw = self.read(ATTEMPT_FILE)
        if raw is None:
            return None
        try:
            current = json.loads(raw)
            return str(current["owner"]), int(current["attempt"])
        except (ValueError, KeyError, TypeError):
            return None  # a stamp cut by hand: the lease and the lock still hold the run

    @property
    def deposed(self) -> str | None:
        """Why this driver lost the run, once it did."""
        return self.fencing.get("deposed")

    def depose(self, why: str) -> None:
        """This driver lost the run (``why``): from now on this store writes nothing."""
        self.fencing.setdefault("deposed", why)

    def refuse_if_not_owner(self, action: str) -> None:
        """Before a write of the driver: refused once deposed; and where this process holds the
        run's lease but its renewals have failed for a while (its host cut off, or frozen),
        another driver may have taken the run over meanwhile: asked first (``check_owner``)."""
        silent = lease_silence_s(self.owner)
        if silent is not None and silent > RENEWALS_MISSED_S:
            self.check_owner(action)
        else:
            self.refuse_if_deposed(action)

    def refuse_if_deposed(self, action: str) -> None:
        if self.deposed:
            raise StaleAttemptError(
                f"Refused to {action} run {self.name!r}: {self.deposed}.\n"
                "HINT: nothing to do here: the driver that took the run over resumes it."
            )

    def read(self, relative: str) -> bytes | None:
        path = self.path(relative)
        with storage_errors("read", self.uri(path)):
            if not self.filesystem.exists(path):
                return None
            with self.filesystem.open(path, "rb") as f:
                return bytes(f.read())

    def remove(self, relative: str) -> None:
        """Remove one file of the run, if it is there."""
        self.refuse_if_not_owner(f"remove {relative!r} from")
        path = self.path(relative)
        with storage_errors("remove", self.uri(path)):
            if self.filesystem.exists(path):
                self.filesystem.rm(path)


class StaleAttemptError(StorageError):
    """A write for an attempt that is not the run's current one, or by a driver that lost the
    run's lease: refused, nothing written."""


def write_files(fs: Any, directory: str, files: dict[str, bytes] | None) -> None:
    for name, data in (files or {}).items():
        with fs.open(f"{directory}/{name}", "wb") as f:
            f.write(data)


def merge_metadata(fs: Any, directory: str, metadata: dict[str, Any]) -> None:
    path = f"{directory}/.metadata.json"
    merged = dict(metadata)
    if fs.exists(path):
        with fs.open(path, "r") as f:
            merged.update(json.load(f))
    with fs.open(path, "w") as f:
        json.dump(merged, f)
