"""The store of an object store (S3, GCS, ``memory://``...): no rename, no append, no lock.

Parts are uploaded straight to the checkpoint's final prefix, each after a staging marker
(``.staging/<dir_name>.<attempt>``, one small PUT) that says a part of an uncommitted round is
there; the commit writes the checkpoint's commit record (``commit_record.py``) as its last
object, and the snapshot listing it commits it (readers and resume go by the snapshot). Parts
of a round that never committed are deleted when the attempt ends or the run resumes (their
staging marker names them). A small file is one PUT, there whole or not at all. History flushes
are part objects folded now and then (``history_parts``), the snapshot is rewritten at every
commit (there is no journal to append to), and the run is claimed with a lease object that has
a heartbeat (``lease``). On S3 the driver's writes are conditional (``If-Match`` the version it
wrote last): a request of a driver given up, delivered late, replaces nothing. Rank logs are
written to a private directory on the driver's machine.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phalanx._foundation import env
from phalanx._foundation.fs.access import (
    copy_tree,
    is_local,
    private_log_dir,
    private_log_path,
    storage_error,
    storage_errors,
)
from phalanx._internal.storage.claim import LEASE_FILE, Owner
from phalanx._internal.storage.commit_record import (
    CommitRecord,
    remove_commit_record,
    write_commit_record,
)
from phalanx._internal.storage.history_parts import PartsLog, read_whole
from phalanx._internal.storage.lease import (
    RENEWALS_MISSED_S,
    Lease,
    LeaseChangedError,
    lease_held,
    lease_silence_s,
)
from phalanx._internal.storage.run_storage import (
    STAGING_DIR,
    RunStorage,
    merge_metadata,
    write_files,
)
from phalanx.errors import StorageError

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

logger = logging.getLogger(__name__)

_CONDITIONAL_TRIES = 4


def takes_conditions(filesystem: Any) -> bool:
    """S3 (s3fs): ``pipe_file`` passes ``IfMatch``/``IfNoneMatch`` to PutObject and answers
    with its ETag; unless PHALANX_S3_CONDITIONAL_WRITES=0. Other object stores write
    unconditionally."""
    protocol = getattr(filesystem, "protocol", ())
    s3 = "s3" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))
    return s3 and env.s3_conditional_writes()


def _conditional(relative: str) -> bool:
    """The driver's run files. Not the lease (``_write_lease``), nor what workers write under
    the staging directory (their own names, new each time)."""
    return relative != LEASE_FILE and not relative.startswith(STAGING_DIR)


def _not_that_version(exc: OSError) -> bool:
    """The store refused a conditional PUT: 412 PreconditionFailed (s3fs raises FileExistsError
    for ``If-None-Match``, ``OSError(EINVAL)`` for ``If-Match``), or 404 for ``If-Match`` on an
    object that is gone."""
    if isinstance(exc, (FileExistsError, FileNotFoundError)):
        return True
    cause = exc.__cause__ or exc.__context__
    response = getattr(cause, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code == "PreconditionFailed" or "pre-conditions you specified" in str(exc)


class _NotThatVersion(StorageError):
    """The store refused a conditional PUT (``_put_if``): the object is not at the version the
    condition named. A StorageError, so ``storage_errors`` passes it on unchanged."""


def _etag(filesystem: Any, path: str) -> str | None:
    try:
        return str(filesystem.info(path, refresh=True)["ETag"])
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class ObjectStore(RunStorage, register=True):
    """A run on any filesystem without rename (see the module docstring)."""

    appends = False

    @classmethod
    def serves(cls, filesystem: object) -> bool:
        return not is_local(filesystem)

    def local_log_dir(self, create: bool = True) -> str:
        if create:
            return private_log_dir(self.name, self.run_uri)
        return private_log_path(self.name, self.run_uri)

    # -- checkpoints ----------------------------------------------------------------------------

    def stage_part(
        self, source: Checkpoint, dir_name: str, attempt: int, move: bool = False
    ) -> None:
        """Upload one rank's files to the final prefix; ``move``: remove the local source after.
        The staging marker goes first: a crash mid-upload leaves parts that are known as such.
        Refused for an attempt that is not the run's current one, before the upload and after
        it (one that was in flight while the attempt moved on is never reported as staged)."""
        action = f"save checkpoint {dir_name!r} to"
        self.check_attempt(attempt, action)
        target = self.path(dir_name)
        try:
            self.filesystem.pipe(self.staging_path(dir_name, attempt), b"")
            copy_tree(source.filesystem, source.path, self.filesystem, target)
        except Exception as exc:
            raise storage_error(action, target, exc) from exc
        self.check_attempt(attempt, action)
        if move and is_local(source.filesystem):
            try:
                shutil.rmtree(source.path)
            except Exception as exc:
                raise storage_error(action, target, exc) from exc

    def mark_in_place(self, dir_name: str, attempt: int) -> None:
        """Every part is in place here already (a stale attempt's is refused)."""
        self.check_attempt(attempt, f"save checkpoint {dir_name!r} to")

    def commit(
        self,
        dir_name: str,
        attempt: int,
        metadata: dict[str, Any] | None,
        extra_files: dict[str, bytes] | None = None,
        record: CommitRecord | None = None,
    ) -> str:
        """The parts are in place; the snapshot entry the caller writes next commits them.
        Refused for a stale attempt or driver (``check_attempt``)."""
        self.check_attempt(attempt, f"commit checkpoint {dir_name!r} in", driver=True)
        final = self.checkpoint_path(dir_name)
        fs = self.filesystem
        with storage_errors(f"commit checkpoint {dir_name!r} in", self.run_uri):
            if not fs.exists(final):  # the NO_UPLOAD parts may be listed late
                fs.makedirs(final, exist_ok=True)
            if not fs.exists(final):  # an empty checkpoint: keep it readable
                fs.pipe(final.rstrip("/") + "/", b"")  # a directory marker, as S3 consoles write
            if metadata:
                merge_metadata(fs, final, metadata)
            write_files(fs, final, extra_files)
            if record is not None:  # last: with it, every other object of the commit is there
                write_commit_record(self, record)
        return final

    def delete_checkpoint(self, dir_name: str) -> None:
        self.refuse_if_not_owner(f"delete checkpoint {dir_name!r} of")
        remove_commit_record(self, dir_name)  # first: a record never outlives its objects
        self._remove_tree(self.checkpoint_path(dir_name), "delete checkpoint")

    def remove_staging(self) -> None:
        self.refuse_if_not_owner("remove uncommitted checkpoint parts of")
        self._remove_tree(self.path(STAGING_DIR), "remove uncommitted checkpoint parts in")

    def _remove_tree(self, path: str, action: str) -> None:
        with storage_errors(action, path):
            if self.filesystem.exists(path):
                self.filesystem.rm(path, recursive=True)

    # -- small files and logs -------------------------------------------------------------------

    def write_atomic(self, relative: str, data: bytes) -> None:
        action = f"write {relative!r} in"
        self.refuse_if_not_owner(action)  # a driver that lost the run: nothing
        final = self.path(relative)
        if takes_conditions(self.filesystem) and relative == LEASE_FILE:
            self._write_lease(final, data)
        elif takes_conditions(self.filesystem) and _conditional(relative):
            self._write_conditional(relative, final, data, action)
        else:
            with storage_errors("write", self.uri(final)), self.filesystem.open(final, "wb") as f:
                f.write(data)
        self._landed(action, final, data)

    def _write_conditional(self, relative: str, final: str, data: bytes, action: str) -> None:
        """One PUT that lands only on the version of the object this driver last wrote (S3's
        ``If-Match``; ``If-None-Match: *`` for one it has not written). A request of this
        driver's that TCP delivers late, after another driver took the run over and wrote the
        same object, is refused by the store itself and replaces nothing.

        A refusal is answered by asking who holds the run (``check_owner``): another driver, and
        this one is deposed (the write raises :class:`StaleAttemptError`); this one, and the
        object was there before its first write (a resumed run) or a given-up driver's late write
        landed on it: it is replaced, on its current version."""
        etags = self.fencing.setdefault("etags", {})
        for _ in range(_CONDITIONAL_TRIES):
            known = etags.get(relative)
            try:
                etags[relative] = self._put_if(final, data, known)
                return
            except _NotThatVersion:
                pass
            except StorageError:
                etags.pop(relative, None)  # not known to have landed: ask its version next time
                raise
            self.check_owner(action)  # another driver holds the run: deposed, refused
            if known:
                logger.warning(
                    "%s changed since this driver wrote it (a write of a driver given up for this "
                    "run landed late); replaced with this driver's.",
                    self.uri(final),
                )
            with storage_errors("write", self.uri(final)):
                etags[relative] = _etag(self.filesystem, final)
        raise StorageError(
            f"Could not write {self.uri(final)!r}: it changed under each of "
            f"{_CONDITIONAL_TRIES} conditional writes (another process writes the same run).\n"
            "HINT: make sure one fit() at a time runs on this run (RunConfig(name=...))."
        )

    def _write_lease(self, final: str, data: bytes) -> None:
        """The lease replaces only the version this driver wrote or read last (a renewal: its
        own write; a takeover: the stale lease it read, ``note_version``); one it knows of
        none is created, never replaced. So neither a late renewal of a driver given up nor two
        drivers taking a stale lease over at once can replace another's lease."""
        etags = self.fencing.setdefault("etags", {})
        known = etags.pop(LEASE_FILE, None)
        try:
            etags[LEASE_FILE] = self._put_if(final, data, known)
        except _NotThatVersion:
            raise LeaseChangedError(
                f"Refused to write the lease {self.uri(final)!r}: it is not the version "
                "this driver wrote or read last (another fit() took the run over)."
            ) from None

    def _put_if(self, final: str, data: bytes, known: str | None) -> str | None:
        """One PUT of ``data`` that lands only on the version ``known`` of the object
        (``If-Match``), or, with none known, only where there is no object (``If-None-Match:
        *``); returns the version written (its ETag; None when the store does not say). A
        refusal raises :class:`_NotThatVersion`, any other failure a StorageError."""
        condition = {"IfMatch": known} if known else {"IfNoneMatch": "*"}
        with storage_errors("write", self.uri(final)):
            try:
                answer = self.filesystem.pipe_file(final, data, **condition)
            except OSError as exc:
                if not _not_that_version(exc):
                    raise
                raise _NotThatVersion(self.uri(final)) from None
        return answer.get("ETag") if isinstance(answer, dict) else None

    @property
    def writes_lease_conditionally(self) -> bool:
        return takes_conditions(self.filesystem)

    def note_version(self, relative: str, if_unknown: bool = False) -> None:
        """Before reading ``relative`` to decide on replacing it: the version read is the one
        a conditional write may replace (asked first, so a write that lands between the two
        makes that write fail rather than replace what was not read). ``if_unknown``: only
        when this store knows no version of it (its last write's answer was lost)."""
        if if_unknown and relative in self.fencing.get("etags", {}):
            return
        if takes_conditions(self.filesystem):
            with storage_errors("read", self.uri(self.path(relative))):
                etag = _etag(self.filesystem, self.path(relative))
            etags = self.fencing.setdefault("etags", {})
            if etag is None:
                etags.pop(relative, None)
            else:
                etags[relative] = etag

    def remove(self, relative: str) -> None:
        super().remove(relative)
        self.fencing.get("etags", {}).pop(relative, None)

    def _landed(self, action: str, final: str, data: bytes) -> None:
        """A write sent while this driver was cut off may land (the client retries it) after
        another driver took the run over: asked again after it, so the first such write stops
        this driver. What it wrote stays (it may have replaced the other driver's object of
        the same name: no delete rule could tell whose it is); see docs/guides/networks.md."""
        silent = lease_silence_s(self.owner)
        if silent is not None and silent > RENEWALS_MISSED_S:
            self.check_owner(action)

    def append_durable(self, relative: str, data: bytes) -> None:
        raise StorageError(
            f"Cannot append to {self.uri(self.path(relative))!r}: an object store has no "
            "appends.\nHINT: this is a bug in phalanx: callers must check the store's `appends`."
        )

    def open_log(self, relative: str) -> PartsLog:
        return PartsLog(self, relative)

    def read_log(self, relative: str) -> bytes:
        return read_whole(self, relative)[0]

    # -- one owner at a time: a lease -----------------------------------------------------------

    def claim(self, owner: Owner, stale_s: float, settle_s: float) -> Lease:
        return Lease.take(self, owner, stale_s, settle_s)

    def claim_held(self) -> bool | None:
        return lease_held(self)
