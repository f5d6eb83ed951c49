"""What follows a failed attempt: the failure budget's decision (retry after a wait, or give
up) and the line that says so; and the line for when the driver is interrupted, saying how to
resume the run. The controller logs both lines, under its own logger."""

from __future__ import annotations

import time

from phalanx._internal.controller.failure_policy import FailureDecision, FailurePolicy, retry_line
from phalanx._internal.controller.interrupt import resume_hint
from phalanx._internal.controller.spec import RunSpec
from phalanx._internal.controller.state import Failure
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_storage import RunStorage


class Retries:
    """Asks the run's ``FailurePolicy`` and says what it decided; the controller acts on it."""

    def __init__(self, spec: RunSpec, storage: RunStorage, manager: CheckpointManager) -> None:
        self.policy = FailurePolicy(spec.run_config.failure_config)
        self.spec = spec
        self.storage = storage
        self.manager = manager

    def may_retry(self, failure: Failure) -> bool:
        """Whether a retry may follow (the engine may then keep the survivors for it)."""
        return self.policy.may_retry(failure.preempted)

    def decide(self, attempt_number: int, failure: Failure) -> tuple[float | None, str]:
        """Seconds to wait before the retry (None: the run gives up), and the line saying so
        (the controller logs it)."""
        match self.policy.decide(failure.preempted):
            case FailureDecision.RETRY:
                ran_for = time.time() - self.manager.attempt_history[-1]["started"]
                delay = self.policy.backoff_s(failure.preempted, ran_for)
                return delay, self._line(attempt_number, failure, delay)
            case FailureDecision.RAISE:
                return None, self._line(attempt_number, failure, None)

    def _line(self, attempt_number: int, failure: Failure, delay: float | None) -> str:
        latest = self.manager.latest_checkpoint or self.spec.resume_from_checkpoint
        where = latest.path.rstrip("/").rsplit("/", 1)[-1] if latest is not None else None
        return retry_line(
            attempt_number,
            failure.error,
            self.policy.budget(failure.preempted),
            None if delay is None else (where, delay),
        )

    def resume_hint(self) -> str:
        """After Ctrl-C: how to resume the run from what it committed."""
        return resume_hint(
            len(self.manager.checkpoints),
            self.manager.latest_checkpoint,
            self.storage.run_uri,
            self.spec.run_name,
        )
