"""``ResultGrid``: the sweep's trials as Results (Ray Tune's names)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx.errors import ConfigError, TrainingFailedError
from phalanx.result import Result
from phalanx.tune._trial import ERROR, TERMINATED, Trial

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ResultGrid", "TrialResult"]


@dataclass
class TrialResult(Result):
    """One trial's outcome: ``config`` is the trial's config, ``metrics`` its last result,
    ``metrics_dataframe`` every result, ``checkpoint`` its latest, ``path`` its directory."""

    trial_config: dict[str, Any] = field(default_factory=dict)
    trial_results: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property  # type: ignore[override]
    def config(self) -> dict[str, Any]:
        return self.trial_config

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([_flat(r) for r in self.trial_results])


class TrialError(TrainingFailedError):
    """A trial that failed (after its retries): what it raised last."""


def trial_result(trial: Trial) -> TrialResult:
    metrics = dict(trial.last_result)
    if metrics:
        metrics["config"] = trial.config
    return TrialResult(
        metrics=metrics,
        checkpoint=trial.checkpoint,
        error=TrialError(trial.error or "failed") if trial.status == ERROR else None,
        path=trial.run_path,
        trial_config=trial.config,
        trial_results=list(trial.results),
    )


class ResultGrid:
    """Every trial's Result, in the order the trials were created.

    Example::

        grid = tuner.fit()
        best = grid.get_best_result(metric="loss", mode="min")
        print(best.config, best.metrics["loss"], len(grid), grid.errors)
    """

    def __init__(
        self,
        trials: list[Trial],
        experiment_path: str,
        metric: str | None = None,
        mode: str | None = None,
    ) -> None:
        self._trials = list(trials)
        self._results = [trial_result(t) for t in trials]
        self.experiment_path = experiment_path
        self._metric, self._mode = metric, mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> TrialResult:
        return self._results[index]

    def __iter__(self) -> Iterator[TrialResult]:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"ResultGrid({len(self)} trials, {self.num_errors} errors, {self.experiment_path})"

    @property
    def errors(self) -> list[BaseException]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return sum(t.status == ERROR for t in self._trials)

    @property
    def num_terminated(self) -> int:
        return sum(t.status == TERMINATED for t in self._trials)

    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> TrialResult:
        """The trial with the best ``metric`` (its last result with ``scope="last"``, its best
        with ``"all"``; ``"last-5-avg"``/``"all-5-avg"`` average the last five)."""
        metric = metric or self._metric
        mode = mode or self._mode
        if metric is None or mode not in ("min", "max"):
            raise ConfigError(
                f"get_best_result needs a metric and a mode (got metric={metric!r}, "
                f"mode={mode!r}).\nHINT: get_best_result(metric='loss', mode='min'), or set "
                "them in TuneConfig."
            )
        if scope not in ("last", "all", "last-5-avg", "last-10-avg", "avg"):
            raise ConfigError(
                f"get_best_result(scope={scope!r}) is invalid: 'last', 'all', 'avg', "
                "'last-5-avg' or 'last-10-avg'."
            )
        sign = 1.0 if mode == "max" else -1.0
        scored = []
        for result in self._results:
            values = [float(r[metric]) for r in result.trial_results if _number(r.get(metric))]
            if filter_nan_and_inf:
                values = [v for v in values if math.isfinite(v)]
            if not values:
                continue
            if scope == "last":
                value = values[-1]
            elif scope == "all":
                value = max(values, key=lambda v: sign * v)
            else:
                tail = values if scope == "avg" else values[-int(scope.split("-")[1]) :]
                value = sum(tail) / len(tail)
            scored.append((sign * value, result))
        if not scored:
            raise RuntimeError(
                f"No trial reported the metric {metric!r}.\nHINT: check the name against "
                f"what the trials report: {sorted({k for r in self._results for k in r.metrics or {}})}."
            )
        return max(scored, key=lambda pair: pair[0])[1]

    def get_dataframe(
        self, filter_metric: str | None = None, filter_mode: str | None = None
    ) -> pd.DataFrame:
        """One row per trial: its last result (or, with ``filter_metric``/``filter_mode``, its
        best), with its config under ``config/<key>``."""
        import pandas as pd

        rows = []
        for trial in self._trials:
            chosen = trial.last_result
            if filter_metric is not None and trial.results:
                sign = 1.0 if filter_mode == "max" else -1.0
                valued = [r for r in trial.results if _number(r.get(filter_metric))]
                if valued:
                    chosen = max(valued, key=lambda r: sign * float(r[filter_metric]))
            row = _flat(chosen)
            row.update(_flat({"config": trial.config}))
            row.update(trial_id=trial.trial_id, status=trial.status, logdir=trial.run_path)
            rows.append(row)
        return pd.DataFrame(rows)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}/"))
        else:
            out[name] = value
    return out
