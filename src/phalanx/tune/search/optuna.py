"""Ray Tune's ``ray.tune.search.optuna`` module path: :class:`OptunaSearch`."""

from __future__ import annotations

from phalanx.tune.search._optuna import OptunaSearch

__all__ = ["OptunaSearch"]
