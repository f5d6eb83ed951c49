"""``OptunaSearch`` (Ray's name and module path, ``ray.tune.search.optuna``): Optuna's samplers
behind the Searcher interface, TPE by default.

The space is the Tuner's ``param_space`` (phalanx's domains become Optuna distributions:
``uniform``/``loguniform``/``quniform`` floats, ``randint``/``qrandint`` ints, ``choice``
categories), Optuna distributions by flat name (``{"train_loop_config/lr": ...}``), or a
define-by-run function ``space(trial) -> constants``. ``grid_search`` and ``sample_from`` are
not Optuna's: the error says what to use instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx._foundation.optional import require
from phalanx.errors import ConfigError
from phalanx.tune._space import (
    Categorical,
    Domain,
    Float,
    Function,
    Integer,
    copy_space,
    is_grid,
    leaves,
    set_path,
)
from phalanx.tune.search._searcher import Searcher

__all__ = ["OptunaSearch"]


class OptunaSearch(Searcher):
    """Optuna's TPE (or any Optuna sampler) choosing each trial's config.

    Example::

        from phalanx.tune.search.optuna import OptunaSearch
        TuneConfig(metric="loss", mode="min", search_alg=OptunaSearch(seed=0), num_samples=20)
    """

    def __init__(
        self,
        space: dict[str, Any] | list[tuple[Any, ...]] | Callable[[Any], Any] | None = None,
        metric: str | list[str] | None = None,
        mode: str | list[str] | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        sampler: Any = None,
        study_name: str | None = None,
        storage: Any = None,
        seed: int | None = None,
        evaluated_rewards: list[Any] | None = None,
    ) -> None:
        require("optuna", "phalanx.tune.search.optuna.OptunaSearch", extra="tune")
        if isinstance(metric, list) or isinstance(mode, list):
            raise ConfigError(
                "OptunaSearch(metric=[...]) is invalid here: phalanx sweeps optimise one "
                "metric.\nHINT: pass one metric name and mode='min' or 'max'."
            )
        super().__init__(metric, mode)
        self._given_space = space
        self._points = list(points_to_evaluate or [])
        self._rewards = list(evaluated_rewards or [])
        self._sampler = sampler
        self._study_name = study_name
        self._storage = storage
        self._seed = seed
        self._constants: dict[str, Any] = {}
        self._distributions: dict[str, Any] | None = None
        self._study: Any = None
        # phalanx trial id -> (Optuna's trial id, its number): report() takes the one, tell()
        # the other
        self._ot_trials: dict[str, tuple[int, int]] = {}

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        super().set_search_properties(metric, mode, config)
        if self._given_space is None:
            self._distributions, self._constants = _convert(config)
        elif isinstance(self._given_space, dict):
            self._distributions, self._constants = _convert(self._given_space)
        return True

    def _ensure_study(self) -> Any:
        if self._study is not None:
            return self._study
        optuna = require("optuna", "OptunaSearch", extra="tune")
        if self._metric is None or self._mode not in ("min", "max"):
            raise ConfigError(
                f"OptunaSearch needs a metric and a mode (got metric={self._metric!r}, "
                f"mode={self._mode!r}).\nHINT: TuneConfig(metric='loss', mode='min')."
            )
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # as Ray: no line per study
        sampler = self._sampler or optuna.samplers.TPESampler(seed=self._seed)
        self._study = optuna.create_study(
            direction="maximize" if self._mode == "max" else "minimize",
            sampler=sampler,
            study_name=self._study_name,
            storage=self._storage,
        )
        for index, point in enumerate(self._points):
            flat = dict(_flatten(point))
            if index < len(self._rewards) and self._distributions is not None:
                self._study.add_trial(
                    optuna.trial.create_trial(
                        params=flat,
                        distributions={k: self._distributions[k] for k in flat},
                        value=self._rewards[index],
                    )
                )
            else:
                self._study.enqueue_trial(flat)
        return self._study

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        study = self._ensure_study()
        if callable(self._given_space) and not isinstance(self._given_space, dict):
            ot_trial = study.ask()
            constants = self._given_space(ot_trial) or {}
            flat = {**dict(ot_trial.params), **dict(_flatten(constants))}
        else:
            ot_trial = study.ask(fixed_distributions=self._distributions or {})
            flat = {**self._constants, **dict(ot_trial.params)}
        self._ot_trials[trial_id] = (ot_trial._trial_id, ot_trial.number)
        return _unflatten(flat)

    def _trial(self, trial_id: str) -> Any:
        optuna = require("optuna", "OptunaSearch", extra="tune")
        return optuna.trial.Trial(self._study, self._ot_trials[trial_id][0])

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id not in self._ot_trials or self._metric not in result:
            return
        step = result.get("training_iteration")
        if isinstance(step, int):
            try:
                self._trial(trial_id).report(float(result[self._metric]), step)
            except Exception:  # a repeated step (a resumed run): Optuna keeps the first
                pass

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        optuna = require("optuna", "OptunaSearch", extra="tune")
        ids = self._ot_trials.pop(trial_id, None)
        if ids is None or self._study is None:
            return
        number = ids[1]
        value = (result or {}).get(self._metric) if self._metric else None
        state = optuna.trial.TrialState
        if error or value is None:
            self._study.tell(number, state=state.FAIL, skip_if_finished=True)
        else:
            self._study.tell(number, float(value), state=state.COMPLETE, skip_if_finished=True)


def _convert(space: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """phalanx domains (or Optuna distributions) by flat name, and the constants."""
    optuna = require("optuna", "OptunaSearch", extra="tune")
    dist = optuna.distributions
    distributions: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for path, value in leaves(space):
        name = "/".join(path)
        if is_grid(value):
            raise ConfigError(
                f"param_space[{name!r}] is a grid_search, which OptunaSearch cannot sample.\n"
                "HINT: use tune.choice([...]) with OptunaSearch, or leave search_alg unset for "
                "grid search."
            )
        if isinstance(value, Function):
            raise ConfigError(
                f"param_space[{name!r}] is a sample_from, which OptunaSearch cannot sample.\n"
                "HINT: use uniform/loguniform/randint/choice, or leave search_alg unset."
            )
        if isinstance(value, Float):
            distributions[name] = dist.FloatDistribution(
                value.lower, value.upper, log=value.log and value.q is None, step=value.q
            )
        elif isinstance(value, Integer):
            upper = value.upper if value.q is not None else value.upper - 1  # randint: exclusive
            distributions[name] = dist.IntDistribution(
                value.lower, upper, log=value.log and value.q is None, step=value.q or 1
            )
        elif isinstance(value, Categorical):
            distributions[name] = dist.CategoricalDistribution(value.categories)
        elif isinstance(value, Domain):
            raise ConfigError(
                f"param_space[{name!r}]={value!r} has no Optuna distribution.\nHINT: use "
                "uniform/loguniform/randint/choice, or leave search_alg unset."
            )
        elif isinstance(value, dist.BaseDistribution):
            distributions[name] = value
        else:
            constants[name] = value
    return distributions, constants


def _flatten(config: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in config.items():
        if isinstance(value, dict) and not is_grid(value):
            items += _flatten(value, f"{prefix}{key}/")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name, value in flat.items():
        parts = tuple(name.split("/"))
        node = config
        for key in parts[:-1]:
            node = node.setdefault(key, {})
        set_path(node, parts[-1:], value)
    return copy_space(config)
