"""The search a sweep gets when its TuneConfig names no ``search_alg``.

Its own module: it picks between :class:`BasicVariantGenerator` and :class:`OptunaSearch`, and
``_optuna`` builds on ``_searcher``'s :class:`Searcher`, so neither of those may import the other
back (tests/test_layering.py forbids the cycle).
"""

from __future__ import annotations

import logging
from typing import Any

from phalanx.tune._space import Function, domain_paths, grid_paths
from phalanx.tune.search._optuna import OptunaSearch
from phalanx.tune.search._searcher import BasicVariantGenerator, Searcher

__all__ = ["default_searcher"]


def default_searcher(space: dict[str, Any], metric: str | None, mode: str | None) -> Searcher:
    """TPE (Optuna) for a space of domains without a grid, with a metric to optimise and optuna
    installed; grid and random search (``BasicVariantGenerator``) otherwise."""
    tpe_fits = (
        metric is not None
        and mode is not None
        and domain_paths(space)
        and not grid_paths(space)
        and not any(isinstance(_at(space, p), Function) for p in domain_paths(space))
    )
    if tpe_fits:
        try:
            import optuna  # noqa: F401
        except ImportError:
            logging.getLogger(__name__).info(
                'optuna is not installed: random search. HINT: pip install "phalanx[tune]" for TPE.'
            )
        else:
            return OptunaSearch()
    return BasicVariantGenerator()


def _at(space: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = space
    for key in path:
        value = value[key]
    return value
