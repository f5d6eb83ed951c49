"""The failure policy's answers and the WARNING a failed attempt logs, pinned where mutation
testing (``bench/mutation.py``) showed the controller-level rows let a bug through.

``may_retry`` decides whether the engine keeps a failed attempt's surviving workers for the
next one (Ray's in-place recovery): it must say RETRY exactly when ``decide`` will. The retry
line is the one thing a user reads about a failed attempt: how each rank failed, which budget
it used, where the next attempt starts and how long it waits.
"""

from __future__ import annotations

import pytest

from phalanx import FailureConfig
from phalanx._internal.controller.failure_policy import (
    BACKOFF_FIRST_S,
    QUICK_FAILURE_S,
    FailureDecision,
    FailurePolicy,
    retry_line,
)
from phalanx.errors import WorkerFailure, WorkerGroupError

BUDGETS = [0, 1, 2, 3, -1]


@pytest.mark.parametrize("preempted", [False, True], ids=["failure", "preemption"])
@pytest.mark.parametrize("limit", BUDGETS)
def test_may_retry_says_retry_exactly_when_decide_will(limit: int, preempted: bool) -> None:
    field = "max_preemption_failures" if preempted else "max_failures"
    policy = FailurePolicy(FailureConfig(**{field: limit}))
    answers = []
    for _ in range(5):
        predicted = policy.may_retry(preempted)
        decided = policy.decide(preempted) is FailureDecision.RETRY
        assert predicted == decided, (limit, preempted, answers)
        answers.append(decided)
    expected = [True] * 5 if limit == -1 else [n < limit for n in range(5)]
    assert answers == expected


def test_may_retry_does_not_count_the_failure() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=1, max_preemption_failures=1))
    for _ in range(3):
        assert policy.may_retry(False) and policy.may_retry(True)
    assert policy.decide(False) is FailureDecision.RETRY
    assert policy.decide(True) is FailureDecision.RETRY


def test_an_attempt_that_ran_exactly_the_quick_limit_is_not_quick_and_restarts_the_doubling() -> (
    None
):
    policy = FailurePolicy(FailureConfig(max_failures=-1))
    assert policy.backoff_s(False, 0.1) == BACKOFF_FIRST_S
    assert policy.backoff_s(False, 0.1) == 2 * BACKOFF_FIRST_S
    assert policy.backoff_s(False, QUICK_FAILURE_S) == 0.0  # ran long enough: no wait
    # the next quick failure waits the first step again, not the third
    assert policy.backoff_s(False, 0.1) == BACKOFF_FIRST_S
    assert policy.backoff_s(False, 0.1) == 2 * BACKOFF_FIRST_S


@pytest.mark.parametrize(
    ("config", "preempted", "used", "text"),
    [
        (FailureConfig(max_failures=-1), False, 3, "failure 3, max_failures=-1 (unlimited)"),
        (FailureConfig(max_failures=2), False, 2, "failure 2 of max_failures=2"),
        (FailureConfig(), True, 2, "preemption 2, max_preemption_failures=-1 (unlimited)"),
        (
            FailureConfig(max_preemption_failures=4),
            True,
            1,
            "preemption 1 of max_preemption_failures=4",
        ),
    ],
)
def test_the_budget_names_the_field_and_says_when_it_is_unlimited(
    config: FailureConfig, preempted: bool, used: int, text: str
) -> None:
    policy = FailurePolicy(config)
    for _ in range(used):
        policy.decide(preempted)
    assert policy.budget(preempted) == text


def _group_error() -> WorkerGroupError:
    return WorkerGroupError(
        {
            rank: WorkerFailure(rank=rank, kind="exception", type_name="ValueError", message="bad")
            for rank in (0, 2)
        }
        | {1: WorkerFailure(rank=1, kind="signal", type_name="", message="", pid=7, signal=9)}
    )


def test_the_retry_line_lists_each_way_the_ranks_failed_on_a_line_of_its_own() -> None:
    line = retry_line(2, _group_error(), "failure 1 of max_failures=3", ("checkpoint_000004", 0))
    assert line.splitlines() == [
        "Attempt 2 failed (failure 1 of max_failures=3); retrying from checkpoint "
        "checkpoint_000004:",
        "  [rank 0, 2] ValueError: bad",
        "  [rank 1] killed by signal 9 (SIGKILL) pid=7",
    ]


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (RuntimeError("the first line\nthe second line"), "  RuntimeError: the first line"),
        (RuntimeError(), "  RuntimeError: "),
    ],
    ids=["first line only", "no message"],
)
def test_an_error_from_no_rank_shows_its_type_and_first_line(
    error: BaseException, shown: str
) -> None:
    line = retry_line(1, error, "failure 1 of max_failures=0", None)
    assert line.splitlines() == [
        "Attempt 1 failed (failure 1 of max_failures=0); giving up:",
        shown,
    ]


def test_the_retry_line_says_where_the_next_attempt_starts_and_how_long_it_waits() -> None:
    error = RuntimeError("boom")
    budget = "failure 2, max_failures=-1 (unlimited)"
    fresh = retry_line(3, error, budget, (None, 0.5)).splitlines()[0]
    assert fresh == (
        "Attempt 3 failed (failure 2, max_failures=-1 (unlimited)); retrying from the beginning "
        "(no checkpoint) in 0.5 s (attempts keep failing within 10 s of their start; the wait "
        "doubles up to 30 s):"
    )
    at_once = retry_line(3, error, budget, ("checkpoint_000001", 0.0)).splitlines()[0]
    assert at_once.endswith("retrying from checkpoint checkpoint_000001:")
