"""Who holds a run, as the loser of a second ``fit()`` reads it: pinned where mutation testing
(``bench/mutation.py``) showed the run-lock tests let a bug through. The error must name the
holder (host, pid, since when, in local time) and say why and what to do.
"""

from __future__ import annotations

import time
from datetime import datetime

from phalanx._internal.storage.claim import Owner, locked_error
from phalanx.errors import StorageError

SINCE = 1_700_000_000.0  # a fixed instant, well before now


def test_the_owner_is_described_by_host_pid_and_local_start_time() -> None:
    owner = Owner("t", "gpu-node-3", 4242, SINCE, SINCE + 100)
    local = datetime.fromtimestamp(SINCE).strftime("%Y-%m-%d %H:%M:%S")
    assert owner.describe() == f"host gpu-node-3, pid 4242, since {local}"


def test_the_error_for_a_run_in_use_names_the_holder_the_cause_and_the_fix() -> None:
    owner = Owner("t", "gpu-node-3", 4242, SINCE, SINCE)
    error = locked_error("exp", "s3://bucket/runs/exp", owner)
    assert isinstance(error, StorageError)
    assert str(error) == (
        f"Run 'exp' at 's3://bucket/runs/exp' is in use by another fit() ({owner.describe()}).\n"
        "Two fit() calls writing one run directory would corrupt each other's checkpoints.\n"
        "HINT: give this run another RunConfig(name=...), or wait for the other fit() to end "
        "(leave name unset for a new unique name on every fit())."
    )


def test_a_holder_not_known_yet_is_an_owner_that_is_starting_up() -> None:
    error = locked_error("exp", "/runs/exp", None)
    assert str(error).splitlines()[0] == (
        "Run 'exp' at '/runs/exp' is in use by another fit() (an owner that is starting up)."
    )


def test_this_process_owns_with_a_fresh_start_and_heartbeat_and_round_trips() -> None:
    before = time.time()
    me = Owner.me()
    assert before <= me.since == me.heartbeat <= time.time()
    assert Owner.from_json(me.to_json()) == me
    assert Owner.from_json(None) is None and Owner.from_json(b"") is None
    assert Owner.from_json(b'{"token": "t"}') is None  # a lease from elsewhere, incomplete
