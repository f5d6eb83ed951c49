"""Callbacks observed by the driver during a run.

A callback's hooks run on the driver, in the controller's thread. An exception raised by a hook
fails the run with :class:`~phalanx.errors.ControllerError` (a callback that hides its errors
would hide the user's).

Example::

    class PrintLoss(phalanx.Callback):
        def after_report(self, run_context, metrics, checkpoint):
            print("loss on each rank:", [m["loss"] for m in metrics])

    RunConfig(callbacks=[PrintLoss()])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.backend import BackendConfig
    from phalanx.checkpoint import Checkpoint
    from phalanx.config import RunConfig, ScalingConfig
    from phalanx.result import Result

__all__ = ["Callback", "TrainRunContext", "UserCallback"]


@dataclass(frozen=True)
class TrainRunContext:
    """What a callback knows about the run."""

    run_config: RunConfig
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    backend_config: BackendConfig
    run_path: str
    run_name: str


class Callback:
    """Driver-side hooks. Override the ones you need."""

    def before_run(self, run_context: TrainRunContext) -> None:
        """Once, before the first worker starts."""

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """After every round of reports: ``metrics[r]`` is rank r's dict (``{}`` for a rank whose
        function had returned before that round); ``checkpoint`` is the round's committed
        checkpoint, if any."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """After an attempt failed; maps rank to what it raised (or an error describing its death)."""

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        """Once, with the final Result (also when the run failed: ``result.error`` is set)."""


UserCallback = Callback  # Ray Train's name
