"""TorchTrainer: data-parallel PyTorch training on phalanx workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.torch._backend import THREAD_ENGINE_MESSAGE
from phalanx.torch._config import TorchConfig
from phalanx.trainer import DataParallelTrainer
from phalanx.validation import ValidationConfig

__all__ = ["TorchTrainer"]


class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on every worker inside a ``torch.distributed`` group.

    Before the function starts, every worker has joined the default process group (gloo on CPU,
    NCCL on GPU; see :class:`TorchConfig`), has torchrun's environment (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``), uses its share of the CPU cores (``OMP_NUM_THREADS``, unless you set it),
    and sees its GPU as the current CUDA device. Accelerate finds the group as
    ``accelerate launch`` would set it up (``ACCELERATE_TORCH_DEVICE``; ``ACCELERATE_USE_CPU``
    on CPU workers), even when the driver used Accelerate before ``fit()``.

    Example::

        import phalanx as train
        from phalanx.torch import TorchTrainer, prepare_model

        def train_func(config):
            model = prepare_model(torch.nn.Linear(10, 1))
            ...
            train.report({"loss": loss.item()})

        result = TorchTrainer(
            train_func, train_loop_config={"lr": 1e-3},
            scaling_config=train.ScalingConfig(num_workers=2),
        ).fit()
    """

    _default_backend_config: Callable[[], TorchConfig] = TorchConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        preprocessor: object = None,
        validation_config: ValidationConfig | None = None,
    ) -> None:
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise ConfigError(
                f"torch_config={torch_config!r} is invalid: it must be a "
                "phalanx.torch.TorchConfig.\nHINT: from phalanx.torch import TorchConfig "
                "(not from ray.train.torch)."
            )
        if scaling_config is not None and scaling_config.engine == "thread":
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=torch_config or TorchConfig(),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
            preprocessor=preprocessor,
            validation_config=validation_config,
        )
