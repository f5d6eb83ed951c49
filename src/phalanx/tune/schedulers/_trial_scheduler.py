"""The scheduler interface (Ray Tune's ``TrialScheduler``) and the default, ``FIFOScheduler``.

A scheduler sees every result of every trial and answers, for the trial that reported it:
``CONTINUE``; ``STOP`` (the trial ends now: its Train run stops at this report, with the
report's checkpoint committed and its workers stopped); or ``PAUSE`` (the trial's run ends
now and starts again at once with the trial's config and ``restore_checkpoint``, which the
scheduler may have changed: how ``PopulationBasedTraining`` exploits another trial).
"""

from __future__ import annotations

from typing import Any

from phalanx.errors import ConfigError

__all__ = ["FIFOScheduler", "TrialScheduler"]


class TrialScheduler:
    """Decides, at each result, whether the trial that reported it goes on.

    Example::

        class StopAbove(TrialScheduler):
            def on_trial_result(self, tune_controller, trial, result):
                return self.STOP if result["loss"] > 10 else self.CONTINUE
    """

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"
    NOOP = "NOOP"

    _metric: str | None = None
    _mode: str | None = None
    _supports_buffered_results = True

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take the TuneConfig's metric and mode where the scheduler was given none."""
        if self._metric is None and metric is not None:
            self._metric = metric
        if self._mode is None and mode is not None:
            self._mode = mode
        return True

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        """A trial was created."""

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        """A trial failed."""

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        return self.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        """A trial ended (its function returned, or it was stopped)."""

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        """A trial was stopped by this scheduler."""

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Which pending trial starts next (None: the oldest)."""
        return None

    def debug_string(self) -> str:
        return type(self).__name__

    def _require_metric(self) -> tuple[str, float]:
        """The metric and its sign (1 to maximise), or a ConfigError saying what to set."""
        if self._metric is None or self._mode not in ("min", "max"):
            raise ConfigError(
                f"{type(self).__name__} needs a metric and a mode (got metric={self._metric!r}, "
                f"mode={self._mode!r}).\nHINT: pass metric= and mode='min'/'max' to the "
                "scheduler or to TuneConfig(metric=..., mode=...)."
            )
        return self._metric, 1.0 if self._mode == "max" else -1.0


def check_mode(owner: str, mode: str | None) -> None:
    if mode is not None and mode not in ("min", "max"):
        raise ConfigError(f"{owner}(mode={mode!r}) is invalid: mode must be 'min' or 'max'.")


class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end, in the order they were created (the default).

    Example::

        TuneConfig(scheduler=FIFOScheduler())
    """

    def __init__(self) -> None:
        super().__init__()
