"""TorchConfig: how the torch process group is set up on the workers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.backend import Backend, BackendConfig
from phalanx.errors import ConfigError

__all__ = ["TorchConfig"]

INIT_METHODS = ("env", "tcp")


@dataclass
class TorchConfig(BackendConfig):
    """How ``torch.distributed`` is set up on every worker before the training function starts.

    ``backend``: ``"gloo"``, ``"nccl"`` (or any backend string torch accepts, such as
    ``"cpu:gloo,cuda:nccl"``); ``None`` picks ``nccl`` when workers have GPUs, else ``gloo``.
    ``init_method``: ``"env"`` (``MASTER_ADDR``/``MASTER_PORT``) or ``"tcp"`` (a ``tcp://`` URL).
    ``timeout_s``: how long ranks wait for each other, when joining the group and in collectives.
    A rank that has not joined the group by then fails the run with an error naming it.

    Example::

        TorchTrainer(train_func, torch_config=TorchConfig(backend="gloo", timeout_s=300),
                     scaling_config=ScalingConfig(num_workers=4))
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            raise ConfigError(
                f"TorchConfig(backend={self.backend!r}) is invalid: backend must be None, "
                "'gloo', 'nccl' or another backend name torch.distributed accepts."
            )
        if self.init_method not in INIT_METHODS:
            raise ConfigError(
                f"TorchConfig(init_method={self.init_method!r}) is invalid: init_method must be "
                "'env' or 'tcp'."
            )
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(
                f"TorchConfig(timeout_s={timeout!r}) is invalid: timeout_s must be a number of "
                "seconds > 0."
            )

    @property
    def backend_cls(self) -> type[Backend]:
        from phalanx.torch._backend import TorchBackend

        return TorchBackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[object]]:
        from phalanx.torch._worker_setup import TrainFuncContext

        return TrainFuncContext

    @property
    def preload_modules(self) -> tuple[str, ...]:
        # DistributedDataParallel() and FSDP() import torch._dynamo lazily: seconds in each new
        # worker. When the run may restart (max_failures != 0), the fork server imports it while
        # the first workers run, so restarted workers (after a failure) start with it.
        return ("torch._dynamo",)

    @property
    def framework(self) -> str | None:
        return "torch"
