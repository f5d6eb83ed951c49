"""A run's metrics as the viewer charts them: the trajectory followed as ``metrics.jsonl`` grows,
kept as columns, and handed to a chart downsampled.

:class:`MetricSeries` reads only the rows written since its last read
(``RunReader.history_since``) and applies ``history.final_trajectory``'s rule row by row: when an
attempt's first row repeats an earlier iteration (it restarted from a checkpoint), the earlier
attempts' rows from that iteration on are dropped. Numbers are kept as float columns (NaN where a
row has no value); strings and the like only in the last row, for the text of the latest
metrics. :func:`downsample` keeps, of each bucket of consecutive points, the first, the last, the
lowest and the highest (so a spike survives), at most ``points`` in all.

Example::

    series = MetricSeries(reader)
    series.refresh()
    payload = series.chart(points=1000)  # {"metrics": {"loss": {"x": [...], "y": [...]}}, ...}
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Sequence
from typing import TypedDict

from phalanx._internal.storage.history import ATTEMPT_COLUMN, user_metrics
from phalanx._internal.storage.reader import HistoryCursor, RunReader
from phalanx.cli._runs import flatten, is_number

NAN = float("nan")


class Curve(TypedDict):
    x: list[float]
    y: list[float]


class AttemptStart(TypedDict):
    attempt: int
    x: float


class Chart(TypedDict):
    """What :meth:`MetricSeries.chart` hands the page (as JSON)."""

    version: int
    rows: int
    metrics: dict[str, Curve]
    names: list[str]
    attempts: list[AttemptStart]
    last: dict[str, object]
    iteration: float | None
    updated: float | None


class MetricSeries:
    """One run's trajectory as columns, followed incrementally (thread-safe)."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.version = 0  # changes whenever the rows do
        self._cursor: HistoryCursor | None = None
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.iterations = array("d")  # training_iteration (NaN where a row has none)
        self.attempts = array("q")
        self.times = array("d")
        self.columns: dict[str, array[float]] = {}
        self.last: dict[str, object] = {}  # the last row's user metrics, flattened
        self._attempt: object = None

    def __len__(self) -> int:
        return len(self.iterations)

    def refresh(self) -> bool:
        """Read what was written since the last call; True when the rows changed."""
        with self._lock:
            chunk = self.reader.history_since(self._cursor)
            self._cursor = chunk.cursor
            if chunk.restarted:
                self._reset()
            for row in chunk.rows:
                self._add(row)
            if chunk.rows or chunk.restarted:
                self.version += 1
                return True
            return False

    def _add(self, row: dict[str, object]) -> None:
        iteration = row.get("training_iteration")
        attempt = row.get(ATTEMPT_COLUMN)
        if attempt != self._attempt:
            self._attempt = attempt
            if is_number(iteration):
                self._supersede(float(iteration))
        n = len(self.iterations)
        self.iterations.append(float(iteration) if is_number(iteration) else NAN)
        self.attempts.append(attempt if isinstance(attempt, int) else 0)
        stamp = row.get("timestamp")
        self.times.append(float(stamp) if is_number(stamp) else NAN)
        flat = flatten(user_metrics(row))
        for name, value in flat.items():
            if not is_number(value):
                continue
            column = self.columns.get(name)
            if column is None:
                column = self.columns[name] = array("d", [NAN]) * n
            column.append(float(value) if math.isfinite(value) else NAN)
        for column in self.columns.values():
            if len(column) == n:  # no value in this row
                column.append(NAN)
        self.last = flat

    def _supersede(self, start: float) -> None:
        """Drop the rows an attempt that restarts at iteration ``start`` replaces."""
        keep = [i for i, it in enumerate(self.iterations) if not it >= start]
        if len(keep) == len(self.iterations):
            return
        self.iterations = array("d", (self.iterations[i] for i in keep))
        self.attempts = array("q", (self.attempts[i] for i in keep))
        self.times = array("d", (self.times[i] for i in keep))
        for name, column in self.columns.items():
            self.columns[name] = array("d", (column[i] for i in keep))

    # -- what a chart gets ----------------------------------------------------------------------

    def xs(self) -> list[float]:
        """The x of each row: its iteration, or its position where it has none."""
        return [it if it == it else float(i + 1) for i, it in enumerate(self.iterations)]

    def chart(self, points: int, metrics: Sequence[str] | None = None) -> Chart:
        """Every (or each named) metric downsampled to ``points``, the attempts' first x, the
        latest metrics and where the run is."""
        with self._lock:
            xs = self.xs()
            names = list(self.columns) if metrics is None else [m for m in metrics]
            charted: dict[str, Curve] = {}
            for name in names:
                column = self.columns.get(name)
                if column is not None:
                    x, y = downsample(xs, column, points)
                    charted[name] = {"x": x, "y": y}
            return {
                "version": self.version,
                "rows": len(xs),
                "metrics": charted,
                "names": list(self.columns),
                "attempts": self._attempt_starts(xs),
                "last": dict(self.last),
                "iteration": xs[-1] if xs else None,
                "updated": self.times[-1]
                if self.times and self.times[-1] == self.times[-1]
                else None,
            }

    def _attempt_starts(self, xs: list[float]) -> list[AttemptStart]:
        starts: list[AttemptStart] = []

        previous = None
        for x, attempt in zip(xs, self.attempts):
            if attempt != previous:
                starts.append({"attempt": attempt, "x": x})
                previous = attempt
        return starts


def downsample(
    xs: Sequence[float], ys: Sequence[float], points: int
) -> tuple[list[float], list[float]]:
    """The finite points of ``(xs, ys)``, at most about ``points`` of them: each of
    ``points // 4`` buckets of consecutive points keeps its first, lowest, highest and last."""
    pairs = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
    if len(pairs) <= max(points, 4):
        return [p[0] for p in pairs], [p[1] for p in pairs]
    buckets = max(1, points // 4)
    size = len(pairs) / buckets
    kept_x: list[float] = []
    kept_y: list[float] = []
    for b in range(buckets):
        segment = pairs[int(b * size) : int((b + 1) * size)]
        if not segment:
            continue
        low = min(range(len(segment)), key=lambda i: segment[i][1])
        high = max(range(len(segment)), key=lambda i: segment[i][1])
        for i in sorted({0, low, high, len(segment) - 1}):
            kept_x.append(segment[i][0])
            kept_y.append(segment[i][1])
    return kept_x, kept_y
