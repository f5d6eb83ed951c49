"""FailurePolicy: decide what a failed attempt leads to. It decides; the controller acts.

Application failures (exceptions, deaths, hangs) and infrastructure failures (preemptions)
have separate budgets, so spot preemptions never use up the retries meant for bugs.

With unlimited retries (``max_failures=-1``) an attempt that fails within ``QUICK_FAILURE_S``
of its start makes the next one wait: 0.5 s, doubling while attempts keep failing that fast, up
to 30 s. A deterministic bug then restarts twice a minute, not many times a second.
"""

from __future__ import annotations

import enum

from phalanx.config import FailureConfig
from phalanx.errors import WorkerGroupError, failure_groups

QUICK_FAILURE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


class FailureDecision(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


class FailurePolicy:
    def __init__(self, config: FailureConfig) -> None:
        self.config = config
        self.failures = 0
        self.preemptions = 0
        self._quick_in_a_row = 0

    def decide(self, preempted: bool) -> FailureDecision:
        if preempted:
            self.preemptions += 1
            used, limit = self.preemptions, self.config.max_preemption_failures
        else:
            self.failures += 1
            used, limit = self.failures, self.config.max_failures
        if limit == -1 or used <= limit:
            return FailureDecision.RETRY
        return FailureDecision.RAISE

    def may_retry(self, preempted: bool) -> bool:
        """Whether ``decide`` would say RETRY now (without counting the failure)."""
        if preempted:
            used, limit = self.preemptions + 1, self.config.max_preemption_failures
        else:
            used, limit = self.failures + 1, self.config.max_failures
        return limit == -1 or used <= limit

    def backoff_s(self, preempted: bool, ran_for_s: float) -> float:
        """How long to wait before the next attempt (after ``decide`` said RETRY)."""
        if preempted or self.config.max_failures != -1:
            return 0.0
        if ran_for_s >= QUICK_FAILURE_S:
            self._quick_in_a_row = 0
            return 0.0
        self._quick_in_a_row += 1
        return min(BACKOFF_FIRST_S * 2 ** (self._quick_in_a_row - 1), BACKOFF_MAX_S)

    def budget(self, preempted: bool) -> str:
        """What the last ``decide`` used of its budget, e.g. ``failure 2 of max_failures=3``."""
        if preempted:
            used, limit, what = self.preemptions, self.config.max_preemption_failures, "preemption"
            field = "max_preemption_failures"
        else:
            used, limit, what, field = (
                self.failures,
                self.config.max_failures,
                "failure",
                "max_failures",
            )
        if limit == -1:
            return f"{what} {used}, {field}=-1 (unlimited)"
        return f"{what} {used} of {field}={limit}"


def retry_line(
    attempt: int, error: BaseException, budget: str, retry: tuple[str | None, float] | None
) -> str:
    """The one WARNING a failed attempt logs: how every rank failed and what happens next.
    ``retry`` is ``(checkpoint dir name or None, seconds to wait)``, or None: giving up."""
    if isinstance(error, WorkerGroupError) and error.worker_failures:
        how = "\n".join(f"  {line}" for line in failure_groups(error.worker_failures))
    else:
        how = f"  {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if retry is None:
        return f"Attempt {attempt} failed ({budget}); giving up:\n{how}"
    checkpoint, delay = retry
    start = f"from checkpoint {checkpoint}" if checkpoint else "from the beginning (no checkpoint)"
    wait = ""
    if delay > 0:
        wait = (
            f" in {delay:g} s (attempts keep failing within {QUICK_FAILURE_S:g} s of their start;"
            f" the wait doubles up to {BACKOFF_MAX_S:g} s)"
        )
    return f"Attempt {attempt} failed ({budget}); retrying {start}{wait}:\n{how}"
