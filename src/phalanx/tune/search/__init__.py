"""Search algorithms, with Ray Tune's names (``ray.tune.search``).

``BasicVariantGenerator`` (grid and random search) needs nothing; ``OptunaSearch``
(``phalanx.tune.search.optuna``, TPE by default) needs ``pip install "phalanx[tune]"``. With no
``search_alg``, a space of domains without a ``grid_search`` is searched with TPE when a metric
and mode are set and Optuna is installed; any other space with ``BasicVariantGenerator``.
"""

from __future__ import annotations

from phalanx.tune._space import grid_search
from phalanx.tune.search._searcher import BasicVariantGenerator, ConcurrencyLimiter, Searcher

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Searcher", "grid_search"]
