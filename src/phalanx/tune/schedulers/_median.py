"""The median stopping rule (Golovin et al., 2017), as Ray Tune's ``MedianStoppingRule``: a
trial stops when its best result so far is worse than the median of the other trials' running
averages at the same point of ``time_attr``."""

from __future__ import annotations

import statistics
from typing import Any

from phalanx.tune.schedulers._trial_scheduler import TrialScheduler, check_mode

__all__ = ["MedianStoppingRule"]


class MedianStoppingRule(TrialScheduler):
    """Stops trials whose best result trails the median of the others.

    Example::

        MedianStoppingRule(time_attr="training_iteration", grace_period=3, min_samples_required=3)
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: int = 0,
        hard_stop: bool = True,
    ) -> None:
        check_mode(type(self).__name__, mode)
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        self._results: dict[str, list[tuple[float, float]]] = {}  # id -> (time, signed metric)
        self._last_decision: dict[str, float] = {}

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        metric, sign = self._require_metric()
        if self._time_attr not in result or metric not in result:
            return self.CONTINUE
        now = float(result[self._time_attr])
        history = self._results.setdefault(trial.trial_id, [])
        history.append((now, sign * float(result[metric])))
        if now < self._grace_period:
            return self.CONTINUE
        if now - self._last_decision.get(trial.trial_id, float("-inf")) < self._min_time_slice:
            return self.CONTINUE
        self._last_decision[trial.trial_id] = now
        others = [
            self._running_mean(points, now)
            for trial_id, points in self._results.items()
            if trial_id != trial.trial_id and points and points[-1][0] >= now
        ]
        if len(others) < self._min_samples_required:
            return self.CONTINUE
        best = max(value for _, value in history)
        if best < statistics.median(others):
            return self.STOP if self._hard_stop else self.PAUSE
        return self.CONTINUE

    @staticmethod
    def _running_mean(points: list[tuple[float, float]], until: float) -> float:
        values = [value for at, value in points if at <= until]
        return sum(values) / len(values) if values else float("-inf")
