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

try:
    import jax as _jax  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "phalanx.jax needs JAX, which is not installed.\n"
        'HINT: pip install "phalanx[jax]" (or pip install jax; jax[cuda12] for GPUs).'
    ) from exc

from phalanx.jax._config import JaxConfig
from phalanx.jax._trainer import JaxTrainer

__all__ = ["JaxConfig", "JaxTrainer"]
