"""The object-store lease keeps its owner: its heartbeat is renewed while fit() runs, so it never
goes stale under a live driver, and releasing it never deletes a lease another driver took over.
A small stale time makes the renewal visible within a second.
"""

from __future__ import annotations

import time
import uuid

import fsspec
import pytest

from phalanx import StorageError
from phalanx._internal.storage.run_lock import LEASE_FILE, Owner, RunLock
from phalanx._internal.storage.run_storage import RunStorage

STALE_S = 1.0  # the heartbeat is renewed every STALE_S / 4


def _memory_run() -> RunStorage:
    storage = RunStorage.create(f"memory://lease-{uuid.uuid4().hex[:8]}", "exp")
    fsspec.filesystem("memory").makedirs(storage.run_path, exist_ok=True)
    return storage


def _lease(storage: RunStorage) -> Owner:
    owner = Owner.from_json(storage.read(LEASE_FILE))
    assert owner is not None, "no lease"
    return owner


def test_the_heartbeat_keeps_a_live_owners_lease_fresh_past_the_stale_time() -> None:
    storage = _memory_run()
    lock = RunLock.acquire(storage, stale_s=STALE_S, settle_s=0.01)
    try:
        taken = lock.owner.heartbeat
        deadline = time.monotonic() + 15
        while True:  # until the lease as first written would be stale, and the held one is not
            lease = _lease(storage)
            now = time.time()
            if now - taken > STALE_S and now - lease.heartbeat < STALE_S / 2:
                break
            assert time.monotonic() < deadline, f"the heartbeat was never renewed: {lease}"
            time.sleep(0.02)
        assert lease.token == lock.owner.token and lease.since == lock.owner.since
        with pytest.raises(StorageError, match=r"in use by another fit\(\)"):
            RunLock.acquire(storage, stale_s=STALE_S, settle_s=0.01)
        assert _lease(storage).token == lock.owner.token
    finally:
        lock.release()
    assert storage.read(LEASE_FILE) is None


def test_releasing_a_lease_another_driver_took_over_leaves_it_in_place() -> None:
    storage = _memory_run()
    paused = RunLock.acquire(storage, stale_s=60, settle_s=0.01)
    # The first driver stalls (a long GC pause, a suspended VM): its lease goes stale.
    stale = Owner(**{**vars(paused.owner), "heartbeat": time.time() - 600})
    storage.write_atomic(LEASE_FILE, stale.to_json())
    # The successor is another fit(): its own store, with its own token
    other = RunStorage(storage.filesystem, storage.storage_path, storage.name)
    successor = RunLock.acquire(other, stale_s=60, settle_s=0.01)
    try:
        assert _lease(storage).token == successor.owner.token
        paused.release()  # the stalled driver wakes up and ends its fit()
        assert _lease(storage).token == successor.owner.token
    finally:
        successor.release()
    assert storage.read(LEASE_FILE) is None
