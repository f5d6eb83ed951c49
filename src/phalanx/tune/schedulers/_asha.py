"""ASHA: asynchronous successive halving (Li et al., 2018), as Ray Tune's ``ASHAScheduler``.

Rungs at ``grace_period * reduction_factor**k`` (up to ``max_t``) of ``time_attr``. When a trial
first reaches a rung, its metric is recorded there and compared with the rung's results so far:
below the top ``1 / reduction_factor`` of them, the trial stops. A trial that reaches ``max_t``
stops too (``stop_last_trials``).
"""

from __future__ import annotations

import math
from typing import Any

from phalanx.errors import ConfigError
from phalanx.tune.schedulers._trial_scheduler import TrialScheduler, check_mode

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]


class _Rung:
    def __init__(self, milestone: float) -> None:
        self.milestone = milestone
        self.recorded: dict[str, float] = {}  # trial id -> signed metric


class AsyncHyperBandScheduler(TrialScheduler):
    """Stops the trials that fall behind at each rung.

    Example::

        ASHAScheduler(max_t=10, grace_period=1, reduction_factor=2)  # rungs at 1, 2, 4, 8
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 100,
        grace_period: int = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ) -> None:
        check_mode(type(self).__name__, mode)
        if not grace_period > 0:
            raise ConfigError(f"ASHAScheduler(grace_period={grace_period}) must be > 0.")
        if not reduction_factor > 1:
            raise ConfigError(f"ASHAScheduler(reduction_factor={reduction_factor}) must be > 1.")
        if not max_t >= grace_period:
            raise ConfigError(
                f"ASHAScheduler(max_t={max_t}) must be >= grace_period={grace_period}."
            )
        if not (isinstance(brackets, int) and brackets >= 1):
            raise ConfigError(f"ASHAScheduler(brackets={brackets}) must be an integer >= 1.")
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._max_t = max_t
        self._reduction_factor = reduction_factor
        self._stop_last_trials = stop_last_trials
        levels = int(math.log(max_t / grace_period) / math.log(reduction_factor) + 1e-9) + 1
        # bracket s starts s rungs later (Hyperband's brackets); trials are spread over them
        self._brackets = [
            [_Rung(grace_period * reduction_factor ** (k + s)) for k in range(levels - s)]
            for s in range(min(brackets, levels))
        ]
        self._bracket_of: dict[str, int] = {}
        self._added = 0

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._bracket_of[trial.trial_id] = self._added % len(self._brackets)
        self._added += 1

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        metric, sign = self._require_metric()
        if self._time_attr not in result or metric not in result:
            return self.CONTINUE
        elapsed = result[self._time_attr]
        if self._stop_last_trials and elapsed >= self._max_t:
            return self.STOP
        value = sign * float(result[metric])
        bracket = self._brackets[self._bracket_of.setdefault(trial.trial_id, 0)]
        for rung in reversed(bracket):  # the highest rung reached decides
            if elapsed < rung.milestone or trial.trial_id in rung.recorded:
                continue
            cutoff = self._cutoff(rung)
            if not math.isnan(value):
                rung.recorded[trial.trial_id] = value
            if math.isnan(value) or (cutoff is not None and value < cutoff):
                return self.STOP
            break
        return self.CONTINUE

    def _cutoff(self, rung: _Rung) -> float | None:
        """The value a trial must reach to stay: the (1 - 1/rf) quantile of the rung so far."""
        values = sorted(rung.recorded.values())
        if not values:
            return None
        return percentile(values, 1 - 1 / self._reduction_factor)

    def debug_string(self) -> str:
        rungs = " ".join(
            f"{r.milestone:g}:{len(r.recorded)}" for bracket in self._brackets for r in bracket
        )
        return f"ASHAScheduler(rungs {rungs})"


ASHAScheduler = AsyncHyperBandScheduler


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolated linearly (numpy's default).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    """
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
