"""File loggers with Ray's names (``ray.tune.logger``): CSV, JSON lines and TensorBoard.

Each writes into the run directory, next to ``metrics.jsonl``: ``progress.csv``,
``result.json`` + ``params.json``, ``tensorboard/``. Rows carry ``step`` (see
:class:`~phalanx.callbacks.ReportInfo`: never repeated across retries and resumes),
``training_iteration``, ``attempt``, ``timestamp`` and ``checkpoint_dir_name``, then the run's
metrics (rank 0's) flattened with ``/``.

Example::

    from phalanx.integrations.logger import CSVLoggerCallback, TBXLoggerCallback

    RunConfig(callbacks=[CSVLoggerCallback(), TBXLoggerCallback()])
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from phalanx._internal.storage.history import encode_json
from phalanx.callbacks import Callback, ReportInfo, TrainRunContext
from phalanx.integrations._common import OutputDir, flatten
from phalanx.integrations._tensorboardx import TBXLoggerCallback

if TYPE_CHECKING:
    from phalanx.result import Result

__all__ = ["CSVLoggerCallback", "JsonLoggerCallback", "TBXLoggerCallback"]


def report_row(report: ReportInfo) -> dict[str, object]:
    """The columns phalanx adds to every row, then the run's metrics."""
    checkpoint = report.checkpoint
    return {
        "step": report.step,
        "training_iteration": report.training_iteration,
        "attempt": report.attempt,
        "timestamp": report.timestamp,
        "checkpoint_dir_name": os.path.basename(checkpoint.path) if checkpoint else None,
        **report.run_metrics,
    }


class _FileLogger(Callback):
    """Opens its file in ``before_run``, uploads it at checkpoints and at the end."""

    filename = ""

    def __init__(self) -> None:
        self._out: OutputDir | None = None

    def before_run(self, run_context: TrainRunContext) -> None:
        self._out = OutputDir(run_context, self.filename)

    def on_report(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        assert self._out is not None, "before_run was not called"
        self.write(self._out.path, report)
        if report.checkpoint is not None:
            self._out.sync()

    def write(self, path: str, report: ReportInfo) -> None:
        raise NotImplementedError

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class CSVLoggerCallback(_FileLogger):
    """One row per round in ``<run>/progress.csv``.

    Unlike Ray's, a metric that first appears mid-run gets a column (the file is rewritten with
    the wider header) instead of being dropped.

    Example::

        RunConfig(name="exp", callbacks=[CSVLoggerCallback()])  # ~/phalanx_results/exp/progress.csv
    """

    filename = "progress.csv"

    def write(self, path: str, report: ReportInfo) -> None:
        row = flatten(report_row(report))
        columns = _header(path)
        if columns and set(row) <= set(columns):
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, columns).writerow(row)
            return
        _rewrite(path, [*columns, *(k for k in row if k not in columns)], row)


def _header(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def _rewrite(path: str, columns: list[str], row: dict[str, object]) -> None:
    """The file with a wider header: old rows kept (empty in new columns), written atomically."""
    rows: list[Mapping[str, object]] = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows([*rows, row])
    os.replace(tmp, path)


class JsonLoggerCallback(_FileLogger):
    """One JSON object per round in ``<run>/result.json`` (nested metrics kept nested), and the
    ``train_loop_config`` in ``<run>/params.json`` (written once; a resumed run keeps it).

    Example::

        RunConfig(name="exp", callbacks=[JsonLoggerCallback()])  # ~/phalanx_results/exp/result.json
    """

    filename = "result.json"

    def before_run(self, run_context: TrainRunContext) -> None:
        super().before_run(run_context)
        params = OutputDir(run_context, "params.json")
        if not os.path.exists(params.path):
            with open(params.path, "w") as f:
                json.dump(run_context.train_loop_config or {}, f, indent=2, default=repr)
        params.close()

    def write(self, path: str, report: ReportInfo) -> None:
        with open(path, "a") as f:
            f.write(encode_json(report_row(report)) + "\n")
