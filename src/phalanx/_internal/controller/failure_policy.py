"""FailurePolicy: decide what a failed attempt leads to. It decides; the controller acts.

Application failures (exceptions, deaths, hangs) and infrastructure failures (preemptions)
have separate budgets, so spot preemptions never use up the retries meant for bugs.
"""

from __future__ import annotations

import enum

from phalanx.config import FailureConfig


class FailureDecision(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


class FailurePolicy:
    def __init__(self, config: FailureConfig) -> None:
        self.config = config
        self.failures = 0
        self.preemptions = 0

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
