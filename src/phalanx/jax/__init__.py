"""phalanx.jax: multi-process JAX (SPMD) training; ``ray.train.v2.jax`` with its imports changed.

Example::

    import phalanx as train
    from phalanx.jax import JaxTrainer

    def train_func(config):
        import jax  # every worker already joined jax.distributed (CPU: gloo collectives)
        ...
        train.report({"loss": float(loss)})

    JaxTrainer(train_func, scaling_config=train.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.jax", "jax"):
    raise _missing

from phalanx.jax._config import JaxConfig
from phalanx.jax._trainer import JaxTrainer

__all__ = ["JaxConfig", "JaxTrainer"]
