"""Callbacks observed by the driver during a run.

A callback's hooks run on the driver, in the controller's thread. An exception raised by a hook
fails the run with :class:`~phalanx.errors.ControllerError` (a callback that hides its errors
would hide the user's).

Example::

    class PrintLoss(phalanx.Callback):
        def after_report(self, run_context, metrics, checkpoint):
            print("loss on each rank:", [m["loss"] for m in metrics])

    RunConfig(callbacks=[PrintLoss()])

Experiment trackers need more than Ray's ``after_report`` gives (the round, the attempt, a step
that never repeats): they override :meth:`Callback.on_report`, a phalanx hook called right after
``after_report`` with a :class:`ReportInfo`. A separate hook (rather than a new ``after_report``
argument or a mutable field on the shared run context) keeps every Ray ``UserCallback`` subclass
working unchanged::

    class PrintStep(phalanx.Callback):
        def on_report(self, run_context, report):
            print(report.step, report.training_iteration, report.attempt, report.run_metrics)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.backend import BackendConfig
    from phalanx.checkpoint import Checkpoint
    from phalanx.config import RunConfig, ScalingConfig
    from phalanx.result import Result

__all__ = ["Callback", "ReportInfo", "TrainRunContext", "UserCallback"]


@dataclass(frozen=True)
class TrainRunContext:
    """What a callback knows about the run.

    Example::

        class Announce(phalanx.Callback):
            def before_run(self, run_context):
                print(run_context.run_name, run_context.run_path, run_context.train_loop_config)
    """

    run_config: RunConfig
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    backend_config: BackendConfig
    run_path: str
    run_name: str


@dataclass(frozen=True)
class ReportInfo:
    """One committed round of reports, as trackers see it.

    ``step`` counts the rounds committed over the run's whole life (1, 2, 3, ...), across retries
    and resumes: a retry restarts the training function from the latest checkpoint, so its rounds
    repeat the ``training_iteration`` of rounds the failed attempt had already reported, but never
    a ``step``. Log against ``step``; ``training_iteration`` is the round's position in the
    trajectory (what Ray calls it) and ``attempt`` is ``get_context().get_attempt()`` of the
    workers that reported it (0 for the first attempt of a ``fit()``).

    Example::

        class Tracker(phalanx.Callback):
            def on_report(self, run_context, report):
                log(report.run_metrics, step=report.step, iteration=report.training_iteration)
    """

    step: int
    training_iteration: int
    attempt: int
    metrics: list[dict[str, Any]]
    checkpoint: Checkpoint | None
    timestamp: float

    @property
    def run_metrics(self) -> dict[str, Any]:
        """The run's metrics for the round: rank 0's (or the lowest rank's that has any)."""
        return next((m for m in self.metrics if m), self.metrics[0] if self.metrics else {})


class Callback:
    """Driver-side hooks. Override the ones you need.

    Example::

        class PrintLoss(phalanx.Callback):
            def on_report(self, run_context, report):
                print(report.step, report.run_metrics.get("loss"))

        RunConfig(name="exp", callbacks=[PrintLoss()])
    """

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

    def on_report(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        """Right after :meth:`after_report`, with the round's step, iteration and attempt
        (phalanx only; Ray has no such hook)."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """After an attempt failed; maps rank to what it raised (or an error describing its death)."""

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        """Once, with the final Result (also when the run failed: ``result.error`` is set)."""


UserCallback = Callback  # Ray Train's name
