"""One owner per run directory: a second ``fit()`` on a run that is in use fails at once.

How a run is claimed is the store's: locally an OS file lock (``fcntl.flock``) on
``<run>/.phalanx_lock`` that the kernel drops when its owner dies (``local_store``); on object
stores a lease object with a heartbeat, taken over once stale (``lease``). Either records the
owner's host, pid and start time, for the error the loser gets.
"""

from __future__ import annotations

from phalanx._foundation.fs.access import storage_errors
from phalanx._internal.storage.claim import (
    LEASE_FILE,
    LOCK_FILE,
    SETTLE_S,
    STALE_S,
    Owner,
)
from phalanx._internal.storage.store import RunClaim, RunStore

__all__ = ["LEASE_FILE", "LOCK_FILE", "STALE_S", "Owner", "RunLock", "lock_held"]


class RunLock:
    """Held by one ``fit()`` from before it touches the run directory until it returns.

    Example::

        lock = RunLock.acquire(storage)
        try:
            ...  # use the run directory
        finally:
            lock.release()
    """

    def __init__(self, storage: RunStore, claim: RunClaim) -> None:
        self.storage = storage
        self._claim = claim

    @property
    def owner(self) -> Owner:
        return self._claim.owner

    @classmethod
    def acquire(
        cls, storage: RunStore, stale_s: float = STALE_S, settle_s: float = SETTLE_S
    ) -> RunLock:
        """Lock the run directory (creating it) or raise StorageError naming the owner."""
        with storage_errors("lock the run directory", storage.run_uri):
            storage.filesystem.makedirs(storage.run_path, exist_ok=True)
            owner = Owner.me(getattr(storage, "owner", None))  # the store's token: fencing
            return cls(storage, storage.claim(owner, stale_s, settle_s))

    def release(self) -> None:
        self._claim.release()


def lock_held(storage: RunStore) -> bool | None:
    """Whether the run's lock is held now (None: the run has none this machine can look at)."""
    return storage.claim_held()
