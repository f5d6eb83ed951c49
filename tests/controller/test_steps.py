"""The controller's transitions one step at a time, over a scripted worker group: rounds commit
when every rank reported, a retry resumes from what the failed attempt committed, and the
per-attempt inputs the trainer hands over (dataset shards, files added to checkpoints) reach
the workers and the checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from controller_stepper import Stepper

from phalanx import Callback, FailureConfig, ValidationConfig
from phalanx._internal.controller.state import Failure, State
from phalanx._internal.storage.checkpoint_manager import PENDING_VALIDATION
from phalanx.errors import ControllerError


def test_a_round_commits_once_every_rank_reported_it(tmp_path):
    stepper = Stepper(tmp_path)
    assert stepper.step() is State.RUNNING
    rank0, rank1 = stepper.workers
    rank0.report(0, {"loss": 1.0})
    assert stepper.step() is State.RUNNING
    assert stepper.controller.last_metrics is None  # rank 1 has not reported round 0
    rank1.report(0, {"loss": 2.0})
    assert stepper.step() is State.RUNNING
    assert stepper.controller.last_metrics == {"loss": 1.0}  # rank 0's metrics, as Ray's
    rank0.finish("model")
    rank1.finish()
    assert stepper.step() is State.FINISHED
    result = stepper.end()
    assert result.metrics == {"loss": 1.0} and result.return_value == "model"


def test_a_retry_resumes_from_the_checkpoint_the_failed_attempt_committed(tmp_path):
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=1))
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    for worker in stepper.workers:
        worker.report(0, {"step": 0}, "checkpoint_a")
    stepper.workers[0].raise_(ValueError("bug"))
    stepper.workers[1].finish()
    failure = stepper.poll_until_not_running()
    assert isinstance(failure, Failure) and not failure.preempted
    assert "ValueError: bug" in str(failure.error)
    assert stepper.step() is State.START
    assert stepper.step() is State.RUNNING
    sessions = [worker.session() for worker in stepper.workers]
    assert [s.attempt for s in sessions] == [1, 1]
    assert [s.start_round for s in sessions] == [1, 1]  # round 0 is committed: it is not redone
    assert all(s.checkpoint is not None for s in sessions)
    assert {Path(s.checkpoint.path).name for s in sessions if s.checkpoint} == {"checkpoint_a"}
    for worker in stepper.workers:
        worker.finish()
    assert stepper.step() is State.FINISHED
    assert Path(stepper.end().checkpoint.path).name == "checkpoint_a"


def test_the_trainers_shards_are_built_for_every_attempt_and_reach_each_rank(tmp_path):
    calls = []

    def make_shards(world_size):
        calls.append(world_size)
        return [{"train": f"shard {rank} of attempt {len(calls)}"} for rank in range(world_size)]

    stepper = Stepper(
        tmp_path, failure_config=FailureConfig(max_failures=1), make_shards=make_shards
    )
    stepper.step()
    shards = [w.session().dataset_shards for w in stepper.workers]
    assert shards == [{"train": "shard 0 of attempt 1"}, {"train": "shard 1 of attempt 1"}]
    stepper.workers[0].die()
    stepper.workers[1].finish()
    stepper.poll_until_not_running()
    assert stepper.step() is State.START
    stepper.step()
    assert calls == [2, 2]
    assert stepper.workers[1].session().dataset_shards == {"train": "shard 1 of attempt 2"}
    for worker in stepper.workers:
        worker.finish()
    stepper.step()
    stepper.end()


def test_the_trainers_checkpoint_files_are_in_every_committed_checkpoint(tmp_path):
    files = {"preprocessor.pkl": b"fitted statistics"}
    stepper = Stepper(tmp_path, num_workers=1, checkpoint_files=files)
    stepper.step()
    for index, name in enumerate(["checkpoint_a", "checkpoint_b"]):
        stepper.stage_checkpoint(name)
        stepper.workers[0].report(index, {"step": index}, name)
        assert stepper.step() is State.RUNNING
    stepper.workers[0].finish()
    assert stepper.step() is State.FINISHED
    run = tmp_path / "runs" / "run"
    for name in ["checkpoint_a", "checkpoint_b"]:
        assert (run / name / "preprocessor.pkl").read_bytes() == b"fitted statistics"
        assert (run / name / "model.txt").read_text() == "weights"  # the rank's own files
    stepper.end()


def test_a_preemption_stops_every_rank_at_one_round_then_retries(tmp_path):
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=0))
    stepper.step()
    rank0, rank1 = stepper.workers
    rank0.report(0, {"step": 0})
    rank0.report(1, {"step": 1})
    rank1.report(0, {"step": 0})
    rank1.preempt()
    assert stepper.step() is State.RUNNING  # rank 0 has not reached the stop round yet
    (notice,) = stepper.engine.notices
    assert notice["stop_round"] == 3 and notice["preempted_ranks"] == [1]
    rank0.stop_for_preemption()
    failure = stepper.poll_until_not_running()
    assert isinstance(failure, Failure) and failure.preempted
    assert stepper.step() is State.START  # max_failures=0 does not apply to preemptions
    assert stepper.step() is State.RUNNING
    for worker in stepper.workers:
        worker.finish()
    assert stepper.step() is State.FINISHED
    assert stepper.end().attempts == 2


def test_a_callback_that_raises_on_a_failure_stops_the_run_without_a_retry(tmp_path):
    seen = {}

    class Broken(Callback):
        def after_exception(self, run_context, worker_exceptions):
            seen.update(worker_exceptions)
            raise RuntimeError("callback bug")

    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=3), callbacks=[Broken()])
    stepper.step()
    stepper.workers[1].raise_(KeyError("missing"))
    stepper.workers[0].finish()
    assert isinstance(stepper.poll_until_not_running(), Failure)
    with pytest.raises(ControllerError, match=r"Broken.after_exception raised RuntimeError"):
        stepper.step()
    assert list(seen) == [1] and isinstance(seen[1], KeyError)  # the rank's own exception
    stepper.abandon()


def _run_leaving_a_validation_unfinished(tmp_path):
    """A run that committed checkpoint_a and stopped before its validation ended."""
    first = Stepper(tmp_path, num_workers=1)
    first.step()
    first.stage_checkpoint("checkpoint_a")
    first.workers[0].report(0, {"loss": 1.0}, "checkpoint_a")
    first.workers[0].finish()
    assert first.step() is State.FINISHED
    first.end()
    manager = first.controller.manager
    manager.statuses["checkpoint_a"] = PENDING_VALIDATION
    manager.save()


def test_a_resumed_run_validates_again_what_the_last_run_left_unfinished(tmp_path):
    _run_leaving_a_validation_unfinished(tmp_path)
    config = ValidationConfig(fn=lambda checkpoint: {"accuracy": 0.9})
    again = Stepper(tmp_path, num_workers=1, validation_config=config)
    again.step()
    again.workers[0].finish()
    assert again.step() is State.FINISHED
    (best,) = again.end().best_checkpoints
    assert best[1] == {"loss": 1.0, "accuracy": 0.9}
    assert again.controller.manager.statuses["checkpoint_a"] == "VALIDATED"


def test_without_a_validation_config_an_unfinished_validation_is_marked_failed(tmp_path, caplog):
    _run_leaving_a_validation_unfinished(tmp_path)
    with caplog.at_level(logging.WARNING, "phalanx"):
        again = Stepper(tmp_path, num_workers=1)
    assert "checkpoint_a was never validated" in caplog.text
    assert again.controller.manager.statuses["checkpoint_a"] == "VALIDATION_FAILED"
    again.abandon()
