"""Locking a run directory that cannot be created fails with a StorageError saying what phalanx
was doing and where: pinned where mutation testing (``bench/mutation.py``) showed the run-lock
tests let a bug through.
"""

from __future__ import annotations

import pytest

from phalanx._internal.storage.run_lock import RunLock
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError


def test_a_run_directory_that_cannot_be_made_fails_naming_the_action_and_the_run(
    tmp_path,
) -> None:
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("a file where the storage path should be")
    storage = RunStorage.create(str(blocker), "exp")
    with pytest.raises(StorageError) as raised:
        RunLock.acquire(storage)
    first = str(raised.value).splitlines()[0]
    assert first.startswith(f"Could not lock the run directory {storage.run_uri!r}: "), first
    assert "HINT: " in str(raised.value)
    assert blocker.read_text() == "a file where the storage path should be"
