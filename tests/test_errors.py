"""Worker failures grouped across ranks, with the earliest failure named as the root cause."""

from __future__ import annotations

import pickle

import pytest

from phalanx import WorkerFailure, WorkerGroupError


def test_failures_are_grouped_across_ranks_and_pickle():
    failures = {
        r: WorkerFailure(r, "exception", "ValueError", f"bad value {r}", "Traceback...", time=r)
        for r in (0, 1, 3)
    }
    error = WorkerGroupError(failures)
    assert "[rank 0, 1, 3] ValueError: bad value 0" in str(error)
    assert "Root cause (earliest failure), rank 0" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.worker_failures.keys() == failures.keys()


@pytest.mark.parametrize(
    "message",
    [
        "UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error [127.0.0.1]:36494: "
        "Connection reset by peer",  # JAX over gloo
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:50105",  # torch DDP over gloo
        "NCCL error: remote process exited or there was a network error",
    ],
)
def test_the_rank_killed_is_the_root_cause_even_when_its_peer_s_error_is_seen_first(message):
    # Rank 1 was SIGKILLed; rank 0's collective then failed, and rank 0's exception reached the
    # driver 30 ms before the fork server reaped rank 1.
    failures = {
        0: WorkerFailure(0, "exception", "RuntimeError", message, "Traceback...", time=100.00),
        1: WorkerFailure(1, "signal", "WorkerKilled", "signal 9", signal=9, pid=7, time=100.03),
    }
    text = str(WorkerGroupError(failures))
    assert "Root cause (earliest failure), rank 1:" in text
    assert "killed by signal 9 (SIGKILL)" in text.split("Root cause")[1]


def test_a_rank_s_own_error_stays_the_root_cause_before_a_peer_s_death():
    # Rank 0 raised in user code; JAX then aborted rank 1 for losing its coordinator.
    failures = {
        0: WorkerFailure(0, "exception", "ValueError", "loss is nan", "Traceback...", time=100.0),
        1: WorkerFailure(1, "signal", "WorkerKilled", "signal 6", signal=6, time=100.03),
    }
    assert "Root cause (earliest failure), rank 0:" in str(WorkerGroupError(failures))
    # and a lost-peer error with no one else to blame is still named
    alone = {0: WorkerFailure(0, "exception", "RuntimeError", "Connection reset by peer")}
    assert "Root cause (earliest failure), rank 0:" in str(WorkerGroupError(alone))
