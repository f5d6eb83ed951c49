"""JaxTrainer: SPMD JAX training on phalanx workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.jax._backend import THREAD_ENGINE_MESSAGE
from phalanx.jax._config import JaxConfig
from phalanx.trainer import DataParallelTrainer
from phalanx.validation import ValidationConfig

__all__ = ["JaxTrainer"]


class JaxTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on every worker of one ``jax.distributed`` cluster.

    Before the function starts, every worker has called ``jax.distributed.initialize`` with
    rank 0 as the coordinator: ``jax.process_index()`` is the worker's rank,
    ``jax.process_count()`` the number of workers, and collectives (``psum`` under
    ``shard_map``, a global ``jax.Array``'s reductions) span every worker: over gloo on CPU,
    one process per GPU with ``use_gpu``. ``jax_config=None`` takes ``use_tpu``/``use_gpu``
    from ``scaling_config``, as Ray does.

    Example::

        import phalanx as train
        from phalanx.jax import JaxTrainer

        def train_func(config):
            import jax
            ...
            train.report({"loss": float(loss)})

        JaxTrainer(train_func, scaling_config=train.ScalingConfig(num_workers=2)).fit()
    """

    _default_backend_config: Callable[[], JaxConfig] = JaxConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object],
        *,
        train_loop_config: dict[str, Any] | None = None,
        jax_config: JaxConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        validation_config: ValidationConfig | None = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        if jax_config is not None and not isinstance(jax_config, JaxConfig):
            raise ConfigError(
                f"jax_config={jax_config!r} is invalid: it must be a phalanx.jax.JaxConfig.\n"
                "HINT: from phalanx.jax import JaxConfig (not from ray.train.v2.jax)."
            )
        if scaling_config is not None and scaling_config.engine == "thread":
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        if jax_config is None:
            scaling = scaling_config or ScalingConfig()
            jax_config = JaxConfig(use_tpu=scaling.use_tpu, use_gpu=scaling.use_gpu)
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=jax_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
            validation_config=validation_config,
        )
