"""No report is lost to the order in which a worker's messages reach the driver.

A rank's reports are queued before its training call resolves, and its exit status travels on
another channel than its reports. Three moments where a report can still be in flight when the
driver decides something: the driver decides the attempt failed, the driver snapshots which calls
are done (between its two drains), the driver learns a process exited. Each test queues the
report at exactly that moment on the stepped controller, so each one fails deterministically if
that drain or that grace is taken out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_stepper import Stepper

from phalanx import FailureConfig
from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.controller.state import Failure, State
from phalanx._internal.engines.messages import Exited


def test_reports_queued_after_the_failure_decision_are_committed_before_the_retry(tmp_path):
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=1))
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    rank0, rank1 = stepper.workers
    rank0.raise_(ValueError("bug after round 0"))
    failure = stepper.step()
    assert isinstance(failure, Failure)
    # Both ranks' reports of round 0 reach the driver only while it tears the attempt down.
    rank0.report(0, {"step": 0}, "checkpoint_a")
    rank1.report(0, {"step": 0}, "checkpoint_a")
    assert stepper.step() is State.START
    assert stepper.step() is State.RUNNING
    sessions = [worker.session() for worker in stepper.workers]
    assert [s.start_round for s in sessions] == [1, 1]  # round 0 was committed, not redone
    assert {Path(s.checkpoint.path).name for s in sessions if s.checkpoint} == {"checkpoint_a"}
    assert (Path(stepper.storage.checkpoint_path("checkpoint_a")) / "model.txt").exists()
    stepper.abandon()


def test_reports_queued_while_the_driver_snapshots_finished_ranks_are_committed(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    stepper = Stepper(tmp_path)
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    rank0, rank1 = stepper.workers
    in_flight = [
        lambda: rank0.report(0, {"loss": 1.0}, "checkpoint_a"),
        lambda: rank1.report(0, {"loss": 2.0}, "checkpoint_a"),
        rank0.finish,
        rank1.finish,
    ]
    snapshot = Attempt.finished_ranks

    def finished_ranks(self: Attempt) -> set[int]:
        # The poll's first drain found nothing; the last reports and both returns land now,
        # just before the driver looks at which calls are done.
        while in_flight:
            in_flight.pop(0)()
        return snapshot(self)

    monkeypatch.setattr(Attempt, "finished_ranks", finished_ranks)
    assert stepper.step() is State.FINISHED
    result = stepper.end()
    assert result.metrics == {"loss": 1.0}
    assert result.checkpoint is not None and Path(result.checkpoint.path).name == "checkpoint_a"


def test_an_exit_status_that_overtakes_the_last_report_does_not_fail_the_attempt(tmp_path):
    stepper = Stepper(tmp_path)  # max_failures=0: any failure would end the run
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    rank0, rank1 = stepper.workers
    rank1.report(0, {"loss": 2.0}, "checkpoint_a")
    rank1.finish()
    # Rank 0 returned; its exit status arrives before its report and its call's result do.
    rank0.events.put((rank0.index, Exited(returncode=0)))
    assert stepper.step() is State.RUNNING  # the exit waits for the messages behind it
    rank0.report(0, {"loss": 1.0}, "checkpoint_a")
    rank0.finish("model")
    assert stepper.poll_until_not_running() is State.FINISHED
    result = stepper.end()
    assert result.metrics == {"loss": 1.0} and result.return_value == "model"
    assert result.checkpoint is not None and Path(result.checkpoint.path).name == "checkpoint_a"


def test_after_a_failure_the_ranks_behind_get_a_grace_to_report_the_failed_ranks_round(tmp_path):
    # Ray's report() is a barrier, phalanx's is not: rank 1 reported round 0 and failed while
    # rank 0 was still writing round 0's checkpoint. The driver waits for it, then fails.
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=1))
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    rank0, rank1 = stepper.workers
    rank1.report(0, {"step": 0}, "checkpoint_a")
    rank1.raise_(FloatingPointError("loss is NaN"))
    assert stepper.step() is State.RUNNING  # rank 0 has not reported round 0 yet
    rank0.report(0, {"step": 0}, "checkpoint_a")
    failure = stepper.step()
    assert isinstance(failure, Failure) and "loss is NaN" in str(failure.error)
    assert stepper.step() is State.START
    assert stepper.step() is State.RUNNING
    assert [worker.session().start_round for worker in stepper.workers] == [1, 1]
    stepper.abandon()
