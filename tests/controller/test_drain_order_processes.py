"""No report is lost to the order in which a real worker's messages reach the driver.

The process form of test_drain_order.py (the stepped controller): the same three moments, each
met by real local workers, a real SIGKILL and a real commit to storage. The driver runs in the
test's process, so the test holds it at the moment (the failure decision, the snapshot of which
calls are done, the exit status) until the worker's message is in flight; each test fails if that
drain or that grace is taken out.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from _helpers import wait_until

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx._internal.controller import attempt as attempt_module
from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.controller.controller import Controller
from phalanx._internal.engines.local.handle import LocalWorkerHandle
from phalanx._internal.engines.messages import Report, Return, decode

pytestmark = pytest.mark.slow


def fit(fn: Any, storage: str, config: dict[str, Any], max_failures: int = 0) -> Any:
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, engine="local"),
        run_config=RunConfig(
            name="run", storage_path=storage, failure_config=FailureConfig(max_failures)
        ),
    ).fit()


def wait_for_file(path: Path) -> None:
    """In a worker: wait (bounded) for the test to create ``path``."""
    wait_until(path.exists, 60, str(path))


def report_model(text: str, metrics: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.txt").write_text(text)
        train.report(metrics, checkpoint=Checkpoint.from_directory(d))


def model_text(checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return Path(d, "model.txt").read_text()


# -- the failure drain (EventIntake.drain_failed_attempt) ----------------------------------------


def rank0_reports_after_rank1_died(config: dict[str, Any]) -> str | None:
    ctx = train.get_context()
    rank, files = ctx.get_world_rank(), Path(config["dir"])
    if ctx.get_attempt() == 0:
        if rank == 1:
            train.report({"step": 0})
            os.kill(os.getpid(), signal.SIGKILL)
        wait_for_file(files / "go")  # the driver decided the attempt failed
        report_model("round 0", {"step": 0})
        threading.Event().wait(60)  # the driver's teardown SIGKILLs this process
    return model_text(train.get_checkpoint())


def test_a_round_completed_while_a_failed_attempt_is_torn_down_is_committed(
    tmp_path: Path, storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 1 reported round 0 and was SIGKILLed; rank 0 reports round 0 only once the driver
    # decided the attempt failed (no grace for it to catch up), before the group is torn down.
    monkeypatch.setattr(attempt_module, "FAILURE_REPORT_GRACE_S", 0.0)
    teardown = Controller._teardown
    held: list[bool] = []

    def hold_teardown(self: Controller, graceful: bool, reuse: bool = False) -> None:
        if not graceful and not held and self.attempt is not None:
            held.append(True)
            (tmp_path / "go").touch()
            queued = self.attempt.group.events.queue
            wait_until(
                lambda: any(isinstance(e, Report) and e.checkpoint_dir_name for _, e in queued),
                30,
                "rank 0's report of round 0 in the driver's queue",
            )
        teardown(self, graceful, reuse)

    monkeypatch.setattr(Controller, "_teardown", hold_teardown)
    result = fit(rank0_reports_after_rank1_died, storage, {"dir": str(tmp_path)}, max_failures=1)
    assert held and result.attempts == 2
    assert result.return_value == "round 0"  # the retry resumed from it: round 0 was committed
    assert model_text(result.checkpoint) == "round 0"


# -- the second drain of a poll (Controller._poll) ------------------------------------------------


def last_report_lands_with_the_return(config: dict[str, Any]) -> int:
    rank, files = train.get_context().get_world_rank(), Path(config["dir"])
    train.report({"step": 0})
    (files / f"ready{rank}").touch()
    wait_for_file(files / "go")  # the driver's poll has drained once already
    report_model("round 1", {"step": 1})
    return rank


def test_a_last_report_that_lands_between_the_polls_drains_is_committed(
    tmp_path: Path, storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = Attempt.finished_ranks
    held: list[bool] = []

    def finished_ranks(self: Attempt) -> set[int]:
        # After the poll's first drain: both ranks report round 1 and return now, before the
        # driver looks at which calls are done.
        ready = all((tmp_path / f"ready{rank}").exists() for rank in range(2))
        if ready and not held:
            held.append(True)
            (tmp_path / "go").touch()
            wait_until(lambda: all(f.done() for f in self.train_futures), 30, "both returns")
        return snapshot(self)

    monkeypatch.setattr(Attempt, "finished_ranks", finished_ranks)
    result = fit(last_report_lands_with_the_return, storage, {"dir": str(tmp_path)})
    assert held and result.return_value == 0
    assert result.metrics == {"step": 1}
    assert model_text(result.checkpoint) == "round 1"
    assert list(result.metrics_dataframe["step"]) == [0, 1]


# -- the exit grace (attempt.EXIT_DRAIN_S) --------------------------------------------------------


def returns_after_one_report(config: dict[str, Any]) -> int:
    train.report({"step": 0})
    return train.get_context().get_world_rank()


def test_a_rank_killed_after_it_returned_whose_exit_overtakes_its_return_fails_nothing(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 0's return value is in its socket when its process is SIGKILLed (an OOM kill, a node
    # agent): the exit status, on the fork server's socket, reaches the driver first.
    exit_seen = threading.Event()
    on_exit, on_message = Attempt.on_exit, LocalWorkerHandle.on_message
    reported: list[bool] = []
    killed: list[int] = []

    def seen_exit(self: Attempt, rank: int, returncode: int) -> None:
        on_exit(self, rank, returncode)
        if rank == 0:
            exit_seen.set()

    def hold_return(self: LocalWorkerHandle, data: bytes) -> None:
        if self.index == 0 and not killed:
            message = decode(pickle.loads(data))
            reported.append(isinstance(message, Report))
            if isinstance(message, Return) and any(reported):  # the training call's return
                assert self.metadata.pid is not None
                killed.append(self.metadata.pid)
                os.kill(self.metadata.pid, signal.SIGKILL)
                assert exit_seen.wait(30), "rank 0's exit status never reached the driver"
        on_message(self, data)

    monkeypatch.setattr(Attempt, "on_exit", seen_exit)
    monkeypatch.setattr(LocalWorkerHandle, "on_message", hold_return)
    result = fit(returns_after_one_report, storage, {})  # max_failures=0: a failure ends it
    assert killed and result.error is None and result.attempts == 1
    assert result.return_value == 0 and result.metrics == {"step": 0}
