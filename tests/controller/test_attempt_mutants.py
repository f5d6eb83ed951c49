"""How an attempt turns a worker's end into the failure the user reads, pinned where mutation
testing (``bench/mutation.py``) showed the controller tests let a bug through: a worker that
exits while its training call is still pending (a forked child holds its socket open), a
connection that breaks while the process lives on or on a handle that knows no exit code, a
failure on every rank of a large group, and a rank that misses the preemption deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from controller_stepper import FakeEngine, FakeWorker, Stepper

from phalanx import FailureConfig
from phalanx._internal.controller.state import Failure, State, Step
from phalanx._internal.engines.base import WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events, Exited
from phalanx.errors import WorkerFailure


class PidEngine(FakeEngine):
    """FakeEngine whose workers have pids (4000 + launch index), as every real worker has."""

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        handles = super().launch(spec, events)
        for handle in handles:
            handle.metadata = WorkerMetadata("fake-host", "fake-node", pid=4000 + handle.index)
        return handles


def _exit_with_call_pending(worker: FakeWorker, returncode: int) -> None:
    """The process is gone, but its connection is not: a child it forked holds the socket."""
    worker.alive, worker.returncode = False, returncode
    worker.events.put((worker.index, Exited(returncode)))


def _break_connection(worker: FakeWorker, alive: bool) -> None:
    assert worker.train is not None
    worker.alive = alive
    worker.train.set_exception(ConnectionError("the worker's connection closed"))


def _poll_on_a_thread(stepper: Stepper, timeout_s: float) -> Step:
    """``poll_until_not_running``, failing the test (not hanging it) if a poll never returns."""
    ended: list[Step | BaseException] = []

    def poll() -> None:
        try:
            ended.append(stepper.poll_until_not_running(timeout_s))
        except BaseException as exc:  # handed to the test's thread
            ended.append(exc)

    thread = threading.Thread(target=poll, name="test-poll", daemon=True)
    thread.start()
    thread.join(timeout_s * 2)
    assert not thread.is_alive(), f"a poll did not return within {timeout_s * 2} s"
    (outcome,) = ended
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@pytest.mark.parametrize(
    ("returncode", "kind", "type_name", "summary"),
    [
        (3, "exit", "WorkerExited", "worker process exited with code 3 pid=4001"),
        (-9, "signal", "WorkerKilled", "killed by signal 9 (SIGKILL) pid=4001"),
    ],
)
def test_a_worker_that_exits_with_its_call_pending_fails_the_attempt_with_its_exit_status(
    tmp_path: Path, returncode: int, kind: str, type_name: str, summary: str
) -> None:
    stepper = Stepper(tmp_path, engine=PidEngine(), failure_config=FailureConfig(max_failures=0))
    assert stepper.step() is State.RUNNING
    _exit_with_call_pending(stepper.workers[1], returncode)
    failure = stepper.poll_until_not_running(timeout_s=10.0)
    assert isinstance(failure, Failure) and not failure.preempted
    assert set(failure.error.worker_failures) == {1}  # rank 0 is still running
    failed = failure.error.worker_failures[1]
    assert (failed.rank, failed.kind, failed.type_name) == (1, kind, type_name)
    assert failed.summary() == summary
    assert summary in str(failure.error)
    stepper.abandon()


def test_broken_connections_of_many_live_workers_are_reported_together(tmp_path: Path) -> None:
    """16 connections break while their processes live on (an unreachable machine): each is
    reported from its connection error, without an exit status, and one bound covers the wait
    for the exit codes of all of them (0.5 s), not 0.5 s each in turn (8 s)."""
    stepper = Stepper(tmp_path, num_workers=16, failure_config=FailureConfig(max_failures=0))
    assert stepper.step() is State.RUNNING
    for worker in stepper.workers:
        _break_connection(worker, alive=True)
    started = time.monotonic()
    failure = _poll_on_a_thread(stepper, timeout_s=30.0)
    assert time.monotonic() - started < 5.0
    assert isinstance(failure, Failure)
    assert set(failure.error.worker_failures) == set(range(16))
    for failed in failure.error.worker_failures.values():
        assert (failed.kind, failed.type_name, failed.exit_code, failed.signal) == (
            "exit",
            "ConnectionError",
            None,
            None,
        )
    stepper.abandon()


def test_a_handle_without_an_exit_code_is_reported_from_its_connection_error(
    tmp_path: Path,
) -> None:
    # WorkerHandle does not require a returncode: the thread and inline engines' have none.
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=0))
    assert stepper.step() is State.RUNNING
    worker = stepper.workers[1]
    del worker.returncode
    _break_connection(worker, alive=False)
    failure = stepper.poll_until_not_running(timeout_s=10.0)
    assert isinstance(failure, Failure)
    failed = failure.error.worker_failures[1]
    assert failed.summary() == "ConnectionError: the worker's connection closed"
    stepper.abandon()


def test_an_exception_on_every_rank_of_a_large_group_is_reported_at_once(tmp_path: Path) -> None:
    # A rank that raised is alive and idle: waiting for it to exit would cost each rank the
    # whole exit-status wait (16 ranks: 8 s) before the user hears of the error.
    stepper = Stepper(tmp_path, num_workers=16, failure_config=FailureConfig(max_failures=0))
    assert stepper.step() is State.RUNNING
    for worker in stepper.workers:
        worker.raise_(ValueError("bad batch"))
    started = time.monotonic()
    failure = stepper.poll_until_not_running(timeout_s=30.0)
    assert time.monotonic() - started < 5.0
    assert isinstance(failure, Failure)
    assert set(failure.error.worker_failures) == set(range(16))
    assert {f.summary() for f in failure.error.worker_failures.values()} == {
        "ValueError: bad batch"
    }
    stepper.abandon()


def test_a_rank_that_misses_the_preemption_deadline_fails_as_preempted_and_is_retried(
    tmp_path: Path,
) -> None:
    grace_s = 0.2
    config = FailureConfig(max_failures=0, preemption_grace_s=grace_s)
    stepper = Stepper(tmp_path, engine=PidEngine(), failure_config=config)
    assert stepper.step() is State.RUNNING
    before = time.time()
    stepper.workers[1].preempt()  # rank 0 never reaches the stop round
    failure = stepper.poll_until_not_running(timeout_s=10.0)
    after = time.time()
    assert isinstance(failure, Failure) and failure.preempted
    failures: dict[int, WorkerFailure] = failure.error.worker_failures
    assert set(failures) == {0, 1}
    assert failures[1].type_name == "PreemptionStop"
    late = failures[0]
    assert late == WorkerFailure(
        0,
        "preempted",
        "PreemptionTimeout",
        "did not reach the stop round before the preemption deadline",
        pid=4000,
        time=late.time,
    )
    assert before + grace_s <= late.time <= after
    assert stepper.step() is State.START  # max_failures=0 does not apply to preemptions
    assert stepper.step() is State.RUNNING
    for worker in stepper.workers:
        worker.finish()
    assert stepper.step() is State.FINISHED
    assert stepper.end().attempts == 2


def test_a_preemption_notice_tells_every_rank_the_stop_round_and_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    grace_s = 30.0
    stepper = Stepper(tmp_path, failure_config=FailureConfig(preemption_grace_s=grace_s))
    assert stepper.step() is State.RUNNING
    rank0, rank1 = stepper.workers
    rank0.report(0, {"step": 0})
    rank1.report(0, {"step": 0})
    assert stepper.step() is State.RUNNING
    before = time.time()
    with caplog.at_level(logging.WARNING, "phalanx"):
        rank1.preempt()
        assert stepper.step() is State.RUNNING  # rank 0 has until the deadline
    after = time.time()
    (notice,) = stepper.engine.notices
    # What a rank's get_preemption_info() returns (PreemptionInfo's fields)
    assert set(notice) == {"stop_round", "preempted_ranks", "deadline"}
    assert (notice["stop_round"], notice["preempted_ranks"]) == (2, [1])
    assert before + grace_s <= notice["deadline"] <= after + grace_s
    assert (
        "Rank 1 was preempted (SIGTERM); every rank stops after round 2, then the run restarts "
        "from the latest checkpoint."
    ) in caplog.messages
    stepper.abandon()
