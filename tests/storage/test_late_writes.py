"""A driver's request that its cut link delivers late, after another driver took the run over,
replaces nothing on S3: the driver's run files and the lease are written conditionally
(``If-Match`` the version this driver wrote last), so the store itself refuses it. A real moto
server behind a real TCP link that the test cuts (holds what the old driver sends) and heals."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from _helpers import HeldLink, wait_until

from phalanx._internal.storage.lease import LeaseChangedError
from phalanx._internal.storage.run_lock import LEASE_FILE, Owner, RunLock
from phalanx._internal.storage.run_storage import (
    SNAPSHOT_FILE,
    RunStorage,
    StaleAttemptError,
)


def _through(link: HeldLink) -> Any:
    """An s3fs filesystem whose requests go over ``link``."""
    import s3fs

    endpoint = {"endpoint_url": f"http://127.0.0.1:{link.port}", "region_name": "us-east-1"}
    return s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs=endpoint, skip_instance_cache=True
    )


def _in_thread(write: Any, *args: Any) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            write(*args)
            outcome.append(None)
        except BaseException as exc:  # the test asserts on it
            outcome.append(exc)

    thread = threading.Thread(target=run, name="test-late-write")
    thread.start()
    return thread, outcome


def _objects(fs: Any, root: str) -> dict[str, str]:
    fs.invalidate_cache()
    return {path: fs.info(path)["ETag"] for path in fs.find(root)}


def test_the_old_drivers_late_snapshot_and_lease_renewal_replace_nothing(
    moto_fs: Any, s3_root: str
) -> None:
    fs = moto_fs
    endpoint = fs.client_kwargs["endpoint_url"].removeprefix("http://")
    host, port = endpoint.split(":")
    with HeldLink((host, int(port))) as link:
        old = RunStorage.create(s3_root, "run", _through(link))
        old.prepare()
        old_lock = RunLock.acquire(old, stale_s=60, settle_s=0.01)
        try:
            old.begin_attempt(0)
            old.write_atomic(SNAPSHOT_FILE, b"old driver, round 1")
            # The old driver's host is cut off just as it sends its next snapshot and a lease
            # renewal: the requests wait in the link.
            link.hold()
            snapshot, snapshot_outcome = _in_thread(
                old.write_atomic, SNAPSHOT_FILE, b"old driver, round 2 (late)"
            )
            beat = Owner(**{**vars(old_lock.owner), "heartbeat": time.time()})
            renewal, renewal_outcome = _in_thread(old.write_atomic, LEASE_FILE, beat.to_json())
            wait_until(lambda: link.requests_held >= 2, what="both requests held in the link")
            # Its lease goes stale; another fit() takes the run over and writes its snapshot.
            stale = Owner(**{**vars(old_lock.owner), "heartbeat": time.time() - 600})
            fs.pipe_file(old.path(LEASE_FILE), stale.to_json())
            new = RunStorage(fs, old.storage_path, old.name)
            new_lock = RunLock.acquire(new, stale_s=60, settle_s=0.01)
            try:
                new.begin_attempt(0)
                new.write_atomic(SNAPSHOT_FILE, b"new driver, round 1")
                before = _objects(fs, old.run_path)
                link.release()  # the link is back: TCP delivers what the old driver sent
                snapshot.join(60)
                renewal.join(60)
                assert before == _objects(fs, old.run_path)  # not one object replaced
                assert fs.cat(new.path(SNAPSHOT_FILE)) == b"new driver, round 1"
                holder = Owner.from_json(fs.cat(new.path(LEASE_FILE)))
                assert holder is not None and holder.token == new.owner
                assert isinstance(renewal_outcome[0], LeaseChangedError), renewal_outcome
                assert isinstance(snapshot_outcome[0], StaleAttemptError), snapshot_outcome
                assert "another fit() holds the run's lease" in str(snapshot_outcome[0])
                # The new driver's own writes go on, on the versions it wrote.
                new.write_atomic(SNAPSHOT_FILE, b"new driver, round 2")
                assert fs.cat(new.path(SNAPSHOT_FILE)) == b"new driver, round 2"
            finally:
                new_lock.release()
        finally:
            old_lock.release()  # the lease is the new driver's: left alone


def test_a_late_write_that_lands_before_the_new_drivers_is_replaced_by_it(
    moto_fs: Any, s3_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The other order: the old driver's late write lands before the new driver wrote that
    file. The new driver's write replaces it (it holds the run) and says so."""
    fs = moto_fs
    run = RunStorage.create(s3_root, "run", fs)
    run.prepare()
    run.write_atomic(SNAPSHOT_FILE, b"this driver")
    fs.pipe_file(run.path(SNAPSHOT_FILE), b"a given-up driver's late write")
    run.write_atomic(SNAPSHOT_FILE, b"this driver, again")
    assert fs.cat(run.path(SNAPSHOT_FILE)) == b"this driver, again"
    assert "changed since this driver wrote it" in caplog.text
