"""FailurePolicy: decide what a failed attempt leads to. It decides; the controller acts."""

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

    def decide(self) -> FailureDecision:
        self.failures += 1
        limit = self.config.max_failures
        if limit == -1 or self.failures <= limit:
            return FailureDecision.RETRY
        return FailureDecision.RAISE
