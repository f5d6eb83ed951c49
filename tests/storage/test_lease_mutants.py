"""The object-store lease, pinned where mutation testing (``bench/mutation.py``) showed the
run-lock tests let a bug through: what the loser of a race is told, what a takeover and a lost
lease log, that ``release`` is safe to repeat, and what ``phalanx ls`` reads as "running"
(``lease_held``). Everything runs on fsspec's in-memory filesystem, with small stale times.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from phalanx import StorageError
from phalanx._internal.storage.claim import LEASE_FILE, STALE_S, Owner
from phalanx._internal.storage.lease import Lease, lease_held
from phalanx._internal.storage.run_storage import RunStorage

LOGGER = "phalanx._internal.storage.lease"


def _memory_run() -> RunStorage:
    storage = RunStorage.create(f"memory://lease-{uuid.uuid4().hex[:8]}", "exp")
    fsspec.filesystem("memory").makedirs(storage.run_path, exist_ok=True)
    return storage


def _owner(heartbeat_age_s: float = 0.0) -> Owner:
    now = time.time()
    return Owner(uuid.uuid4().hex, "other-host", 4242, now - 3600, now - heartbeat_age_s)


def _lease_token(storage: RunStorage) -> str | None:
    owner = Owner.from_json(storage.read(LEASE_FILE))
    return owner.token if owner is not None else None


def _wait_for(condition, what: str, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_held_lease_refuses_a_second_owner_naming_the_run_its_uri_and_the_holder() -> None:
    storage = _memory_run()
    holder = _owner()
    storage.write_atomic(LEASE_FILE, holder.to_json())
    with pytest.raises(StorageError) as raised:
        Lease.take(storage, _owner(), stale_s=60, settle_s=0.01)
    message = str(raised.value)
    assert f"Run 'exp' at {storage.run_uri!r} is in use by another fit() ({holder.describe()})" in (
        message
    )
    assert _lease_token(storage) == holder.token


def test_a_fresh_lease_is_created_exclusively_without_waiting_to_settle() -> None:
    # Only an overwrite (a takeover) needs the settle wait; exclusive create does not.
    storage = _memory_run()
    me = _owner()
    started = time.monotonic()
    lease = Lease.take(storage, me, stale_s=60, settle_s=30)
    try:
        assert time.monotonic() - started < 15
        assert Owner.from_json(storage.read(LEASE_FILE)) == me
    finally:
        lease.release()


def test_taking_over_a_stale_lease_logs_whose_it_was_and_how_long_it_was_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = _memory_run()
    stale = _owner(heartbeat_age_s=600)
    storage.write_atomic(LEASE_FILE, stale.to_json())
    me = _owner()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        lease = Lease.take(storage, me, stale_s=60, settle_s=0.01)
    try:
        assert _lease_token(storage) == me.token
        warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert warnings == [
            f"Taking over run 'exp': its lease ({stale.describe()}) has had no heartbeat for 600 s."
        ]
    finally:
        lease.release()


def _take_over_stale_lease_while(storage: RunStorage, interfere: Callable[[], None]) -> str:
    """A driver takes over a stale lease; once its own lease is written, ``interfere`` runs
    during the settle wait. Returns the message of the StorageError take() raised."""
    storage.write_atomic(LEASE_FILE, _owner(heartbeat_age_s=600).to_json())
    loser = _owner()
    outcome: list[BaseException | Lease] = []

    def take() -> None:
        try:
            outcome.append(Lease.take(storage, loser, stale_s=60, settle_s=3))
        except BaseException as exc:
            outcome.append(exc)

    taker = threading.Thread(target=take)
    taker.start()
    _wait_for(lambda: _lease_token(storage) == loser.token, "the loser's lease")
    interfere()
    taker.join(timeout=30)
    assert len(outcome) == 1, "take() did not return"
    error = outcome[0]
    if isinstance(error, Lease):
        error.release()
    assert isinstance(error, StorageError), error
    return str(error)


def test_the_loser_of_a_takeover_race_fails_naming_the_winner() -> None:
    storage = _memory_run()
    winner = _owner()
    # A second driver that read the same stale lease writes its own during the settle wait.
    message = _take_over_stale_lease_while(
        storage, lambda: storage.write_atomic(LEASE_FILE, winner.to_json())
    )
    assert f"Run 'exp' at {storage.run_uri!r} is in use by another fit() ({winner.describe()})" in (
        message
    )
    assert _lease_token(storage) == winner.token


def test_a_lease_gone_during_the_settle_wait_is_lost_to_an_owner_starting_up() -> None:
    storage = _memory_run()
    message = _take_over_stale_lease_while(storage, lambda: storage.remove(LEASE_FILE))
    assert "(an owner that is starting up)" in message


def test_an_owner_whose_lease_was_taken_over_stops_renewing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = _memory_run()
    me, successor = _owner(), _owner()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        lease = Lease.take(storage, me, stale_s=0.2, settle_s=0.01)  # a beat every 0.05 s
        heartbeat = lease._heartbeat
        assert heartbeat is not None
        storage.write_atomic(LEASE_FILE, successor.to_json())
        heartbeat.join(timeout=15)  # the heartbeat ends on its own once it sees the successor
        assert not heartbeat.is_alive(), "the heartbeat kept running under another owner"
        lease.release()
    assert _lease_token(storage) == successor.token  # never overwritten, never deleted
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"The lease of run 'exp' was taken over by {successor.describe()}: another fit() now "
        "writes to this run directory."
    ]


def test_a_lease_that_cannot_be_read_is_renewed_again_and_released_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = _memory_run()
    me = _owner()
    fs = fsspec.filesystem("memory")
    lease_path = storage.path(LEASE_FILE)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        lease = Lease.take(storage, me, stale_s=0.2, settle_s=0.01)
        fs.rm(lease_path)
        fs.makedirs(lease_path + "/blocked", exist_ok=True)  # reading the lease now fails

        def renewals_failed() -> int:
            return sum(1 for r in caplog.records if r.getMessage().startswith("Could not renew"))

        _wait_for(lambda: renewals_failed() >= 2, "two failed renewals")
        lease.release()
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    renew = [m for m in messages if m.startswith("Could not renew")]
    assert renew[0].startswith("Could not renew the lease of run 'exp': Could not read ")
    assert lease_path in renew[0]
    release = [m for m in messages if m.startswith("Could not release")]
    assert len(release) == 1 and release[0].startswith("Could not release the lease of run 'exp' (")
    assert release[0].endswith(f"); it goes stale in {STALE_S:.0f} s.")
    assert lease_path in release[0]


def test_releasing_twice_never_deletes_the_next_owners_lease() -> None:
    storage = _memory_run()
    first = Lease.take(storage, _owner(), stale_s=60, settle_s=0.01)
    first.release()
    assert storage.read(LEASE_FILE) is None
    second_owner = _owner()
    second = Lease.take(storage, second_owner, stale_s=60, settle_s=0.01)
    try:
        first.release()  # a second release of the first lease: nothing happens
        assert _lease_token(storage) == second_owner.token
    finally:
        second.release()
    assert storage.read(LEASE_FILE) is None


def test_lease_held_reads_fresh_stale_missing_and_unreadable_leases() -> None:
    storage = _memory_run()
    assert lease_held(storage) is None  # no lease: a run that is not running
    storage.write_atomic(LEASE_FILE, _owner().to_json())
    assert lease_held(storage) is True
    storage.write_atomic(LEASE_FILE, _owner(heartbeat_age_s=30).to_json())
    assert lease_held(storage, stale_s=60) is True
    assert lease_held(storage, stale_s=10) is False
    storage.write_atomic(LEASE_FILE, _owner(heartbeat_age_s=STALE_S + 5).to_json())
    assert lease_held(storage) is False
    storage.write_atomic(LEASE_FILE, json.dumps({"token": "t"}).encode())  # no heartbeat
    assert lease_held(storage) is None
    storage.write_atomic(LEASE_FILE, b"not json")
    assert lease_held(storage) is None
    storage.write_atomic(LEASE_FILE, json.dumps({"heartbeat": time.time()}).encode())
    assert lease_held(storage) is True  # only the heartbeat is read


def test_lease_held_is_none_when_the_lease_cannot_be_read() -> None:
    storage = _memory_run()
    fsspec.filesystem("memory").makedirs(storage.path(LEASE_FILE) + "/blocked", exist_ok=True)
    assert lease_held(storage) is None


class _NoExclusiveCreate(MemoryFileSystem):
    """An object store whose SDK has no exclusive create (older gcsfs/s3fs: "xb" is refused)."""

    protocol = "noexclusive"

    def _open(self, path, mode="rb", **kwargs):  # type: ignore[no-untyped-def]
        if "x" in mode:
            raise ValueError(f"mode {mode!r} is not supported")
        return super()._open(path, mode, **kwargs)


def test_without_exclusive_create_the_lease_is_written_and_still_refuses_a_second_owner() -> None:
    fsspec.register_implementation("noexclusive", _NoExclusiveCreate, clobber=True)
    storage = RunStorage.create(f"noexclusive://lease-{uuid.uuid4().hex[:8]}", "exp")
    storage.filesystem.makedirs(storage.run_path, exist_ok=True)
    me = _owner()
    lease = Lease.take(storage, me, stale_s=60, settle_s=0.01)
    try:
        assert _lease_token(storage) == me.token
        with pytest.raises(StorageError, match=r"in use by another fit\(\)"):
            Lease.take(storage, _owner(), stale_s=60, settle_s=0.01)
    finally:
        lease.release()
    assert storage.read(LEASE_FILE) is None


def test_a_live_owners_lease_never_looks_stale() -> None:
    # What `phalanx ls` and a second driver see: renewed every stale_s / 4, the lease is held
    # at every look for several stale periods.
    storage = _memory_run()
    lease = Lease.take(storage, _owner(), stale_s=1.5, settle_s=0.01)
    try:
        deadline = time.monotonic() + 3.0  # two stale periods; renewals every 0.375 s
        while time.monotonic() < deadline:
            assert lease_held(storage, stale_s=1.5) is True
            time.sleep(0.05)
    finally:
        lease.release()


def test_the_heartbeat_is_a_named_daemon_thread() -> None:
    # A driver that dies without release() must not hang at exit; a stack dump names the thread.
    storage = _memory_run()
    lease = Lease.take(storage, _owner(), stale_s=60, settle_s=0.01)
    try:
        beats = [t for t in threading.enumerate() if t is lease._heartbeat]
        assert len(beats) == 1
        assert beats[0].name == "phalanx-run-lease" and beats[0].daemon
    finally:
        lease.release()
