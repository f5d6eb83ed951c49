"""The run's claim on object stores, which have no locks: a lease object with a heartbeat.

The owner creates ``<run>/.phalanx_lease.json`` (owner token, host, pid, since, heartbeat) with an
exclusive create (S3's ``If-None-Match: *``, fsspec's ``"xb"`` mode), a background thread renews
its heartbeat, and ``release`` deletes it. A lease whose heartbeat is older than ``stale_s``
belongs to a dead driver and is taken over; the new lease is given a moment for a concurrent
writer's to land and read back: of two drivers racing, only the one whose lease is there goes on.
(A filesystem without exclusive create takes that path for new leases too.) On S3 every write of
the lease is conditional besides (``ObjectStore._write_lease``): a renewal replaces only its own
last version, a takeover only the stale lease it read, so a renewal delivered late by a healed
link cannot replace the lease of the driver that took the run over.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from phalanx._internal.storage.claim import HEARTBEAT_S, LEASE_FILE, STALE_S, Owner, locked_error
from phalanx._internal.storage.store import RunStore
from phalanx.errors import StorageError

logger = logging.getLogger(__name__)

# A lease held by this process, whose renewals have all failed for this long: its driver may have
# been cut off long enough for another to take the run over (that needs STALE_S without a
# heartbeat): its stores ask before they write (``RunStorage.refuse_if_not_owner``)
RENEWALS_MISSED_S = 1.5 * HEARTBEAT_S
_renewed: dict[str, float] = {}  # owner token -> when its lease was last written (monotonic)


def lease_silence_s(token: str) -> float | None:
    """Seconds since this process last wrote the lease of ``token``; None: it holds none."""
    at = _renewed.get(token)
    return None if at is None else time.monotonic() - at


class LeaseChangedError(StorageError):
    """A conditional write of the lease (S3) met a version this driver did not write or read:
    another driver's lease is there now; nothing was written."""


class Lease:
    """A run held on an object store; see the module docstring."""

    def __init__(self, storage: RunStore, owner: Owner) -> None:
        self.storage = storage
        self.owner = owner
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def take(cls, storage: RunStore, owner: Owner, stale_s: float, settle_s: float) -> Lease:
        lease = cls(storage, owner)
        if not lease._create():
            note_version = getattr(storage, "note_version", None)
            if note_version is not None:  # the takeover below replaces only the lease read here
                note_version(LEASE_FILE)
            current = Owner.from_json(storage.read(LEASE_FILE))
            if current is not None and time.time() - current.heartbeat < stale_s:
                raise locked_error(storage.name, storage.run_uri, current)
            if current is not None:
                logger.warning(
                    "Taking over run %r: its lease (%s) has had no heartbeat for %.0f s.",
                    storage.name,
                    current.describe(),
                    time.time() - current.heartbeat,
                )
            try:  # on S3 only over the stale lease just read: of two drivers, one wins here
                storage.write_atomic(LEASE_FILE, owner.to_json())
            except LeaseChangedError:
                raise locked_error(
                    storage.name, storage.run_uri, Owner.from_json(storage.read(LEASE_FILE))
                ) from None
            time.sleep(settle_s)  # a driver that read the same lease writes its own by now
            winner = Owner.from_json(storage.read(LEASE_FILE))
            if winner is None or winner.token != owner.token:
                raise locked_error(storage.name, storage.run_uri, winner)
        _renewed[owner.token] = time.monotonic()
        lease._heartbeat = threading.Thread(
            target=lease._renew, args=(stale_s,), name="phalanx-run-lease", daemon=True
        )
        lease._heartbeat.start()
        return lease

    def release(self) -> None:
        if self._heartbeat is None:
            return
        self._stop.set()
        self._heartbeat.join()
        self._heartbeat = None
        _renewed.pop(self.owner.token, None)
        try:  # fit()'s own result or error matters more than a lease left to go stale
            current = Owner.from_json(self.storage.read(LEASE_FILE))
            if current is not None and current.token == self.owner.token:
                self.storage.filesystem.rm(self.storage.path(LEASE_FILE))
        except Exception as exc:
            logger.warning(
                "Could not release the lease of run %r (%s); it goes stale in %.0f s.",
                self.storage.name,
                exc,
                STALE_S,
            )

    def _create(self) -> bool:
        """Create the lease if there is none; False if one exists (or the filesystem cannot
        create exclusively)."""
        if getattr(self.storage, "writes_lease_conditionally", False):
            try:  # If-None-Match: *, and the store keeps its version for the renewals
                self.storage.write_atomic(LEASE_FILE, self.owner.to_json())
            except LeaseChangedError:
                return False
            return True
        try:
            with self.storage.filesystem.open(self.storage.path(LEASE_FILE), "xb") as f:
                f.write(self.owner.to_json())
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError, TypeError):  # no exclusive create here
            return False
        return True

    def _renew(self, stale_s: float) -> None:
        interval = min(HEARTBEAT_S, stale_s / 4)
        while not self._stop.wait(interval):
            try:
                note_version = getattr(self.storage, "note_version", None)
                if note_version is not None:  # a renewal whose answer was lost: ask again
                    note_version(LEASE_FILE, if_unknown=True)
                current = Owner.from_json(self.storage.read(LEASE_FILE))
                if current is None or current.token != self.owner.token:
                    # Gone: only a driver that took it over and ended since deletes our lease
                    who = current.describe() if current is not None else "a fit() that ended since"
                    logger.error(
                        "The lease of run %r was taken over by %s: another fit() now writes to "
                        "this run directory.",
                        self.storage.name,
                        who,
                    )
                    depose = getattr(self.storage, "depose", None)
                    if depose is not None:  # this driver writes nothing more into the run
                        depose(f"another fit() took the run's lease over ({who})")
                    return
                beat = Owner(**{**vars(self.owner), "heartbeat": time.time()})
                self.storage.write_atomic(LEASE_FILE, beat.to_json())
                _renewed[self.owner.token] = time.monotonic()
            except Exception as exc:  # a storage hiccup: try again at the next beat
                logger.warning("Could not renew the lease of run %r: %s", self.storage.name, exc)


def lease_held(storage: RunStore, stale_s: float = STALE_S) -> bool | None:
    """A lease with a fresh heartbeat is held; a stale one is not; None: no lease to read."""
    try:
        raw = storage.read(LEASE_FILE)
    except StorageError:
        return None
    if raw is None:
        return None
    try:
        heartbeat = float(json.loads(raw)["heartbeat"])
    except (ValueError, KeyError, TypeError):
        return None
    return time.time() - heartbeat < stale_s
