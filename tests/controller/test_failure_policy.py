"""The failure policy, as a user sees it: which failures retry, which budget each one uses, the
wait between quick failures, and the error ``fit()`` raises when the budget runs out.

Every row runs the real controller, one state at a time, over a scripted worker group
(``controller_stepper``): each attempt ends the way the row says, and the row lists what the
controller decided after each attempt.
"""

from __future__ import annotations

import logging

import pytest
from controller_stepper import FakeEngine, Stepper

from phalanx import FailureConfig
from phalanx._internal.controller.failure_policy import BACKOFF_MAX_S
from phalanx._internal.controller.state import Failure, State
from phalanx.errors import (
    HangError,
    PreemptionError,
    WorkerGroupError,
    WorkerStartupError,
)

BUG = ValueError("bug in the training function")


def end_attempt(stepper: Stepper, how: str) -> None:
    """End the current attempt: every rank ends ``how`` ("raise" and "die" hit rank 0 only,
    the other ranks return)."""
    workers = stepper.workers
    if how == "return":
        for worker in workers:
            worker.finish("done")
    elif how == "raise":
        workers[0].raise_(BUG)
        for worker in workers[1:]:
            worker.finish()
    elif how == "die":
        workers[0].die(signal=9)
        for worker in workers[1:]:
            worker.finish()
    elif how == "preempt":
        for worker in workers:
            worker.preempt()
    elif how != "hang":  # "hang": nobody reports; the watchdog fires
        raise AssertionError(how)


def run_script(stepper: Stepper, script: list[str]) -> list[str]:
    """Run one attempt per item of ``script``; returns what followed each: "retry", "raise" or
    "finish"."""
    decisions = []
    for how in script:
        assert stepper.state is State.START
        if how in ("startup", "setup"):  # the attempt fails before training starts
            assert isinstance(stepper.step(), Failure)
        else:
            assert stepper.step() is State.RUNNING
            end_attempt(stepper, how)
            stepper.poll_until_not_running()
        if stepper.state is State.FINISHED:
            decisions.append("finish")
            continue
        assert isinstance(stepper.state, Failure)
        decisions.append({State.START: "retry", State.ERRORED: "raise"}[stepper.step()])
    return decisions


def scripted_engine(script: list[str]) -> FakeEngine:
    """Attempts that fail to start come first in every script."""
    return FakeEngine(script.count("startup"), script.count("setup"))


ROWS = {
    # name: (FailureConfig, how each attempt ends, the decisions, the error fit() raises)
    "a bug fails the run at once by default (max_failures=0)": (
        FailureConfig(),
        ["raise"],
        ["raise"],
        WorkerGroupError,
    ),
    "a bug is retried max_failures times, then raised": (
        FailureConfig(max_failures=2),
        ["raise", "raise", "raise"],
        ["retry", "retry", "raise"],
        WorkerGroupError,
    ),
    "a retry that succeeds ends the run normally": (
        FailureConfig(max_failures=1),
        ["raise", "return"],
        ["retry", "finish"],
        None,
    ),
    "a killed worker uses the same budget as a bug": (
        FailureConfig(max_failures=1),
        ["die", "raise"],
        ["retry", "raise"],
        WorkerGroupError,
    ),
    "workers that never start are retried like a failure": (
        FailureConfig(max_failures=1),
        ["startup", "return"],
        ["retry", "finish"],
        None,
    ),
    "workers that never start use up max_failures": (
        FailureConfig(max_failures=1),
        ["startup", "startup"],
        ["retry", "raise"],
        WorkerStartupError,
    ),
    "an error while setting the workers up is retried like a bug": (
        FailureConfig(max_failures=1),
        ["setup", "setup"],
        ["retry", "raise"],
        WorkerGroupError,
    ),
    "a hang is a failure: HangError once the budget is used": (
        FailureConfig(max_failures=1, hang_timeout_s=0.05),
        ["hang", "hang"],
        ["retry", "raise"],
        HangError,
    ),
    "preemptions retry forever by default, without touching max_failures": (
        FailureConfig(max_failures=0),
        ["preempt", "preempt", "preempt", "return"],
        ["retry", "retry", "retry", "finish"],
        None,
    ),
    "preemptions have their own budget": (
        FailureConfig(max_failures=5, max_preemption_failures=1),
        ["preempt", "preempt"],
        ["retry", "raise"],
        PreemptionError,
    ),
    "a preemption leaves the failure budget for bugs": (
        FailureConfig(max_failures=1, max_preemption_failures=1),
        ["preempt", "raise", "raise"],
        ["retry", "retry", "raise"],
        WorkerGroupError,
    ),
    "unlimited retries (max_failures=-1) retry bugs until one attempt works": (
        FailureConfig(max_failures=-1),
        ["raise"] * 4 + ["return"],
        ["retry"] * 4 + ["finish"],
        None,
    ),
}


@pytest.mark.parametrize("row", ROWS, ids=list(ROWS))
def test_failure_policy(tmp_path, row):
    config, script, decisions, error = ROWS[row]
    stepper = Stepper(tmp_path, failure_config=config, engine=scripted_engine(script))
    try:
        assert run_script(stepper, script) == decisions
    finally:
        if stepper.state not in (State.FINISHED, State.ERRORED):
            stepper.abandon()
    if error is None:
        result = stepper.end()
        assert result.error is None and result.attempts == len(script)
        # every failed attempt's error is kept with the run, the last attempt has none
        assert [e is not None for e in result.attempt_errors] == [True] * (len(script) - 1) + [
            False
        ]
        return
    with pytest.raises(error) as raised:
        stepper.end()
    assert type(raised.value) is error  # the exact kind, not a parent class
    assert raised.value.result is not None and raised.value.result.attempts == len(script)
    assert all(raised.value.result.attempt_errors)
    assert (tmp_path / "runs" / "run" / "error.txt").read_text() == str(raised.value)


WAITS = {
    # name: (FailureConfig, script, waits before each retry)
    "quick bugs back off, doubling, with unlimited retries": (
        FailureConfig(max_failures=-1),
        ["raise"] * 4 + ["return"],
        [0.5, 1.0, 2.0, 4.0],
    ),
    "a finite budget retries at once": (
        FailureConfig(max_failures=3),
        ["raise"] * 3 + ["return"],
        [0.0, 0.0, 0.0],
    ),
    "preemptions never wait, even with unlimited retries": (
        FailureConfig(max_failures=-1),
        ["preempt"] * 3 + ["return"],
        [0.0, 0.0, 0.0],
    ),
    "start-up failures back off like bugs": (
        FailureConfig(max_failures=-1),
        ["startup", "startup", "return"],
        [0.5, 1.0],
    ),
}


@pytest.mark.parametrize("row", WAITS, ids=list(WAITS))
def test_wait_before_a_retry(tmp_path, row):
    config, script, waits = WAITS[row]
    stepper = Stepper(tmp_path, failure_config=config, engine=scripted_engine(script))
    run_script(stepper, script)
    assert stepper.waits == waits
    stepper.end()


def test_backoff_stops_doubling_at_its_cap(tmp_path):
    stepper = Stepper(tmp_path, num_workers=1, failure_config=FailureConfig(max_failures=-1))
    run_script(stepper, ["raise"] * 9 + ["return"])
    assert stepper.waits[-1] == BACKOFF_MAX_S and max(stepper.waits) == BACKOFF_MAX_S
    stepper.end()


def test_each_failed_attempt_says_which_budget_it_used(tmp_path, caplog):
    config = FailureConfig(max_failures=1, max_preemption_failures=2)
    stepper = Stepper(tmp_path, failure_config=config)
    with caplog.at_level(logging.WARNING, "phalanx"):
        run_script(stepper, ["preempt", "raise", "raise"])
    lines = [r.getMessage().splitlines()[0] for r in caplog.records if "Attempt" in r.message]
    assert lines == [
        "Attempt 1 failed (preemption 1 of max_preemption_failures=2); retrying from the "
        "beginning (no checkpoint):",
        "Attempt 2 failed (failure 1 of max_failures=1); retrying from the beginning (no "
        "checkpoint):",
        "Attempt 3 failed (failure 2 of max_failures=1); giving up:",
    ]
    with pytest.raises(WorkerGroupError, match="bug in the training function"):
        stepper.end()
