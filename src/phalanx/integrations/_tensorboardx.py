"""TensorBoard event files through tensorboardX (``pip install 'phalanx[tensorboard]'``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from phalanx.callbacks import Callback, ReportInfo, TrainRunContext
from phalanx.integrations._common import OutputDir, goodput_metrics, require, scalars

if TYPE_CHECKING:
    from phalanx._foundation.goodput_parts import Goodput
    from phalanx.result import Result

__all__ = ["TBXLoggerCallback"]

TB_DIR = "tensorboard"


class TBXLoggerCallback(Callback):
    """Scalars of the run's metrics (rank 0's) at each round's ``step``, in
    ``<run>/tensorboard/`` or ``logdir``: ``tensorboard --logdir <storage_path>`` compares runs.

    Tags are the metric names (nested dicts joined with ``/``); Ray prefixed them with
    ``ray/tune/``. Non-numeric values are left to the CSV/JSON loggers.

    Example::

        RunConfig(callbacks=[TBXLoggerCallback()])
    """

    def __init__(self, logdir: str | None = None, flush_secs: float = 10.0) -> None:
        require("tensorboardX", "TBXLoggerCallback")
        self.logdir = logdir
        self.flush_secs = flush_secs
        self._writer: Any = None
        self._out: OutputDir | None = None

    def before_run(self, run_context: TrainRunContext) -> None:
        tensorboardx = require("tensorboardX", "TBXLoggerCallback")
        if self.logdir is None:
            self._out = OutputDir(run_context, TB_DIR)
        path = self._out.path if self._out is not None else self.logdir
        # tensorboardX names its file by the second and the host: a second fit() into the same
        # directory within that second (a quick retry or resume) would truncate the first's file; nanoseconds keep them in order.
        self._writer = tensorboardx.SummaryWriter(
            logdir=path, flush_secs=self.flush_secs, filename_suffix=f".{time.time_ns()}"
        )

    def on_report(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        values = scalars(report.run_metrics)
        values["training_iteration"] = float(report.training_iteration)
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=report.step, walltime=report.timestamp)
        if report.checkpoint is not None:
            self._writer.flush()
            if self._out is not None:
                self._out.sync()

    def on_goodput(self, run_context: TrainRunContext, attempt: int, goodput: Goodput) -> None:
        """At the end of each attempt: where the run's time went so far (step: the attempt)."""
        if self._writer is not None:
            for tag, value in goodput_metrics(goodput).items():
                self._writer.add_scalar(tag, value, global_step=attempt)
            self._writer.flush()

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        if self._writer is not None:
            self._writer.flush()  # a retry follows, or the end: what was logged is on disk

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._out is not None:
            self._out.close()
            self._out = None
