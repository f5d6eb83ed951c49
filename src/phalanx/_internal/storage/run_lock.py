"""One owner per run directory: a second ``fit()`` on a run that is in use fails at once.

Locally the lock is an OS file lock (``fcntl.flock``) on ``<run>/.phalanx_lock``: the kernel
drops it when the owner dies, so a crashed driver never leaves the run locked. The file also
holds the owner's host, pid and start time, for the error the loser gets.

Object stores have no locks: the owner creates a lease object ``<run>/.phalanx_lease.json``
(owner token, host, pid, since, heartbeat) with an exclusive create (S3's ``If-None-Match: *``,
fsspec's ``"xb"`` mode), a background thread renews its heartbeat, and ``release`` deletes it. A
lease whose heartbeat is older than ``stale_s`` belongs to a dead driver and is taken over; an
overwrite cannot be made exclusive, so the new lease is given a moment for a concurrent writer's
to land and read back: of two drivers racing, only the one whose lease is there goes on. (A
filesystem without exclusive create takes that path for new leases too.)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from phalanx._internal.storage.filesystem import storage_errors
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError

logger = logging.getLogger(__name__)

LOCK_FILE = ".phalanx_lock"
LEASE_FILE = ".phalanx_lease.json"
HEARTBEAT_S = 10.0
STALE_S = 60.0
SETTLE_S = 0.5


@dataclass(frozen=True)
class Owner:
    token: str
    host: str
    pid: int
    since: float
    heartbeat: float

    @classmethod
    def me(cls) -> Owner:
        now = time.time()
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, since {since}"

    def to_json(self) -> bytes:
        return json.dumps(vars(self)).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> Owner | None:
        try:
            return cls(**json.loads(data or b""))
        except (ValueError, TypeError):
            return None


class RunLock:
    """Held by one ``fit()`` from before it touches the run directory until it returns.

    Example::

        lock = RunLock.acquire(storage)
        try:
            ...  # use the run directory
        finally:
            lock.release()
    """

    def __init__(self, storage: RunStorage, owner: Owner) -> None:
        self.storage = storage
        self.owner = owner
        self._fd: int | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def acquire(
        cls, storage: RunStorage, stale_s: float = STALE_S, settle_s: float = SETTLE_S
    ) -> RunLock:
        """Lock the run directory (creating it) or raise StorageError naming the owner."""
        lock = cls(storage, Owner.me())
        with storage_errors("lock the run directory", storage.run_uri):
            storage.filesystem.makedirs(storage.run_path, exist_ok=True)
            if storage.local:
                lock._lock_file()
            else:
                lock._take_lease(stale_s, settle_s)
        return lock

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._heartbeat is not None:
            self._stop.set()
            self._heartbeat.join()
            self._heartbeat = None
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

    # -- local: an OS file lock -----------------------------------------------------------------

    def _lock_file(self) -> None:
        import fcntl

        fd = os.open(self.storage.path(LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Owner.from_json(os.pread(fd, 4096, 0))
            os.close(fd)
            raise _locked_error(self.storage, holder) from None
        except OSError as exc:  # a filesystem without locks (some network mounts): go on
            os.close(fd)
            logger.warning(
                "Cannot lock the run directory %r (%s): nothing stops another fit() from using "
                "it at the same time.",
                self.storage.run_path,
                exc,
            )
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.owner.to_json(), 0)
        self._fd = fd

    # -- object stores: a lease with a heartbeat ------------------------------------------------

    def _take_lease(self, stale_s: float, settle_s: float) -> None:
        if not self._create_lease():
            current = Owner.from_json(self.storage.read(LEASE_FILE))
            if current is not None and time.time() - current.heartbeat < stale_s:
                raise _locked_error(self.storage, current)
            if current is not None:
                logger.warning(
                    "Taking over run %r: its lease (%s) has had no heartbeat for %.0f s.",
                    self.storage.name,
                    current.describe(),
                    time.time() - current.heartbeat,
                )
            self.storage.write_atomic(LEASE_FILE, self.owner.to_json())
            time.sleep(settle_s)  # a driver that read the same lease writes its own by now
            winner = Owner.from_json(self.storage.read(LEASE_FILE))
            if winner is None or winner.token != self.owner.token:
                raise _locked_error(self.storage, winner)
        self._heartbeat = threading.Thread(
            target=self._renew, args=(stale_s,), name="phalanx-run-lease", daemon=True
        )
        self._heartbeat.start()

    def _create_lease(self) -> bool:
        """Create the lease if there is none; False if one exists (or the filesystem cannot
        create exclusively)."""
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
                current = Owner.from_json(self.storage.read(LEASE_FILE))
                if current is not None and current.token != self.owner.token:
                    logger.error(
                        "The lease of run %r was taken over by %s: another fit() now writes to "
                        "this run directory.",
                        self.storage.name,
                        current.describe(),
                    )
                    return
                beat = Owner(**{**vars(self.owner), "heartbeat": time.time()})
                self.storage.write_atomic(LEASE_FILE, beat.to_json())
            except Exception as exc:  # a storage hiccup: try again at the next beat
                logger.warning("Could not renew the lease of run %r: %s", self.storage.name, exc)


def _locked_error(storage: RunStorage, holder: Owner | None) -> StorageError:
    who = holder.describe() if holder is not None else "an owner that is starting up"
    return StorageError(
        f"Run {storage.name!r} at {storage.run_uri!r} is in use by another fit() ({who}).\n"
        "Two fit() calls writing one run directory would corrupt each other's checkpoints.\n"
        "HINT: give this run another RunConfig(name=...), or wait for the other fit() to end "
        "(leave name unset for a new unique name on every fit())."
    )
