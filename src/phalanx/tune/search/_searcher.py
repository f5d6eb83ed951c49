"""Search algorithms, with Ray Tune's names: ``Searcher`` (the interface),
``BasicVariantGenerator`` (grid and random search, phalanx's own), ``ConcurrencyLimiter``.

``BasicVariantGenerator`` has Ray's semantics: ``points_to_evaluate`` first, then
``num_samples`` passes over every combination of the ``grid_search`` values, the other domains
sampled anew for each trial (a space without a grid gives ``num_samples`` trials).
"""

from __future__ import annotations

import random
from typing import Any

from phalanx.errors import ConfigError
from phalanx.tune._space import grid_combinations, grid_paths, resolve

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Searcher"]


class Searcher:
    """Suggests a config per trial and learns from the results.

    ``suggest`` returns a config, None (nothing now: ask again when a trial ends) or
    ``Searcher.FINISHED`` (no more trials).

    Example::

        class Fixed(Searcher):
            def suggest(self, trial_id):
                return {"lr": 0.01}
    """

    FINISHED = "FINISHED"

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        if mode is not None and mode not in ("min", "max"):
            raise ConfigError(
                f"{type(self).__name__}(mode={mode!r}) is invalid: mode must be 'min' or 'max'."
            )
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """Take the TuneConfig's metric, mode and param_space (where it has none of its own)."""
        if self._metric is None and metric is not None:
            self._metric = metric
        if self._mode is None and mode is not None:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # pragma: no cover
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An intermediate result."""

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """The trial's last result (None and ``error=True`` when it failed)."""

    @property
    def total_samples(self) -> int | None:
        """How many trials it makes in all, when it decides that (None: ``num_samples``)."""
        return None


class BasicVariantGenerator(Searcher):
    """Grid search and random search.

    Example::

        BasicVariantGenerator(random_state=0)   # reproducible samples
    """

    def __init__(
        self,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        max_concurrent: int = 0,
        constant_grid_search: bool = False,
        random_state: int | random.Random | None = None,
    ) -> None:
        super().__init__()
        self._points = [dict(p) for p in points_to_evaluate or []]
        self.max_concurrent = max_concurrent
        self._constant_grid = constant_grid_search
        self._rng: random.Random = (
            random_state if isinstance(random_state, random.Random) else random.Random(random_state)
        )
        self._space: dict[str, Any] = {}
        self._num_samples = 1
        self._queue: list[dict[str, Any]] | None = None
        self._made = 0
        self._live: set[str] = set()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        super().set_search_properties(metric, mode, config)
        self._space = config
        self._num_samples = int(spec.get("num_samples", 1))
        return True

    @property
    def total_samples(self) -> int:
        grid = len(grid_combinations(self._space)) if grid_paths(self._space) else 1
        return len(self._points) + self._num_samples * grid

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        if self._made >= self.total_samples:
            return self.FINISHED
        index, self._made = self._made, self._made + 1
        self._live.add(trial_id)
        if index < len(self._points):
            return _merged(self._space, self._points[index], self._rng)
        grids = grid_combinations(self._space) if grid_paths(self._space) else [{}]
        combo = grids[(index - len(self._points)) % len(grids)]
        return resolve(self._space, self._rng, combo)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)


def _merged(space: dict[str, Any], point: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A point to evaluate: its values, the rest of the space sampled."""
    config = resolve(space, rng)
    _update(config, point)
    return config


def _update(config: dict[str, Any], point: dict[str, Any]) -> None:
    for key, value in point.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            _update(config[key], value)
        else:
            config[key] = value


class ConcurrencyLimiter(Searcher):
    """At most ``max_concurrent`` of ``searcher``'s trials run at once (Ray's name).

    Example::

        ConcurrencyLimiter(OptunaSearch(), max_concurrent=4)
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ConfigError(
                f"ConcurrencyLimiter(max_concurrent={max_concurrent!r}) must be an int >= 1."
            )
        super().__init__()
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self._live: set[str] = set()

    @property
    def metric(self) -> str | None:
        return self.searcher.metric

    @property
    def mode(self) -> str | None:
        return self.searcher.mode

    @property
    def total_samples(self) -> int | None:
        return self.searcher.total_samples

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if len(self._live) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if isinstance(suggestion, dict):
            self._live.add(trial_id)
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)
        self.searcher.on_trial_complete(trial_id, result, error)
