"""Population based training (Jaderberg et al., 2017), as Ray Tune's
``PopulationBasedTraining``.

Every ``perturbation_interval`` of ``time_attr``, a trial in the bottom ``quantile_fraction`` of
the population (by its last result) *exploits* one of the top ``quantile_fraction``: it takes
that trial's latest checkpoint and a perturbed copy of its config (*explore*), and its run
starts again from there at once (a warm start: the training function's ``get_checkpoint()``
returns the other trial's checkpoint). A trial in the top quantile goes on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from phalanx.errors import ConfigError
from phalanx.tune._space import Domain, copy_space
from phalanx.tune.schedulers._trial_scheduler import TrialScheduler, check_mode

__all__ = ["PopulationBasedTraining"]

Mutations = dict[str, Any]


class PopulationBasedTraining(TrialScheduler):
    """Exploit the best trials' checkpoints, explore around their configs.

    Example::

        PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=4,
            hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "momentum": [0.8, 0.9, 0.99]},
        )
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Mutations | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: tuple[float, float] = (1.2, 0.8),
        custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        seed: int | None = None,
    ) -> None:
        check_mode(type(self).__name__, mode)
        if not hyperparam_mutations and custom_explore_fn is None:
            raise ConfigError(
                "PopulationBasedTraining needs hyperparam_mutations or custom_explore_fn: "
                "without them explore changes nothing.\nHINT: hyperparam_mutations="
                "{'lr': tune.loguniform(1e-4, 1e-1)}."
            )
        if not 0 < quantile_fraction <= 0.5:
            raise ConfigError(
                f"PopulationBasedTraining(quantile_fraction={quantile_fraction}) must be in "
                "(0, 0.5]."
            )
        if not perturbation_interval > 0:
            raise ConfigError(
                f"PopulationBasedTraining(perturbation_interval={perturbation_interval}) must "
                "be > 0."
            )
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._interval = perturbation_interval
        self._burn_in = burn_in_period
        self._mutations = hyperparam_mutations or {}
        self._quantile = quantile_fraction
        self._resample = resample_probability
        self._factors = perturbation_factors
        self._custom_explore = custom_explore_fn
        self._require_attrs = require_attrs
        self._rng = random.Random(seed)
        self._scores: dict[str, float] = {}  # trial id -> signed last metric
        self._last_perturbation: dict[str, float] = {}
        self._trials: dict[str, Any] = {}
        self.num_perturbations = 0

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._trials[trial.trial_id] = trial
        self._last_perturbation.setdefault(trial.trial_id, 0.0)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self._scores.pop(trial.trial_id, None)  # a finished trial is no donor: it will not go on

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        metric, sign = self._require_metric()
        if self._time_attr not in result or metric not in result:
            if self._require_attrs:
                missing = [k for k in (self._time_attr, metric) if k not in result]
                raise ConfigError(
                    f"PopulationBasedTraining: trial {trial.trial_id} reported {sorted(result)} "
                    f"without {missing}.\nHINT: report them, or pass require_attrs=False."
                )
            return self.CONTINUE
        self._trials[trial.trial_id] = trial
        now = float(result[self._time_attr])
        self._scores[trial.trial_id] = sign * float(result[metric])
        if now < self._burn_in:
            return self.CONTINUE
        if now - self._last_perturbation.get(trial.trial_id, 0.0) < self._interval:
            return self.CONTINUE
        self._last_perturbation[trial.trial_id] = now
        lower, upper = self._quantiles()
        if trial.trial_id not in lower:
            return self.CONTINUE
        donors = [self._trials[t] for t in upper if self._trials[t].checkpoint is not None]
        if not donors:
            return self.CONTINUE  # nothing to warm-start from yet
        donor = self._rng.choice(donors)
        trial.exploit(donor, self.explore(donor.config))
        self.num_perturbations += 1
        return self.PAUSE

    def _quantiles(self) -> tuple[list[str], list[str]]:
        ranked = sorted(self._scores, key=lambda t: self._scores[t])
        if len(ranked) <= 1:
            return [], []
        count = min(math.ceil(len(ranked) * self._quantile), len(ranked) // 2)
        return ranked[:count], ranked[-count:]

    def explore(self, config: dict[str, Any]) -> dict[str, Any]:
        """A perturbed copy of ``config``: each mutated value resampled (with
        ``resample_probability``, or when it is not among a list's values), else moved to a
        neighbouring list entry or multiplied by one of ``perturbation_factors``."""
        new = _explore(
            copy_space(config), self._mutations, self._resample, self._factors, self._rng
        )
        return self._custom_explore(new) if self._custom_explore is not None else new


def _explore(
    config: dict[str, Any],
    mutations: Mutations,
    resample: float,
    factors: tuple[float, float],
    rng: random.Random,
) -> dict[str, Any]:
    for key, mutation in mutations.items():
        old = config.get(key)
        if isinstance(mutation, dict):
            config[key] = _explore(dict(old or {}), mutation, resample, factors, rng)
        elif isinstance(mutation, list | tuple):
            values = list(mutation)
            if old not in values or rng.random() < resample:
                config[key] = rng.choice(values)
            else:
                index = values.index(old) + rng.choice([-1, 1])
                config[key] = values[min(max(index, 0), len(values) - 1)]
        elif isinstance(mutation, Domain) or callable(mutation):
            sample = mutation.sample(rng) if isinstance(mutation, Domain) else mutation()
            if old is None or rng.random() < resample or not isinstance(old, int | float):
                config[key] = sample
            else:
                moved = old * rng.choice(list(factors))
                config[key] = int(moved) if isinstance(old, int) else moved
        else:
            raise ConfigError(
                f"hyperparam_mutations[{key!r}]={mutation!r} is invalid: it must be a list, a "
                "search space (tune.uniform, ...), a function or a dict of those."
            )
    return config
