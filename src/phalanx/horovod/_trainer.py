"""HorovodTrainer and HorovodConfig with Ray's signatures; both raise, saying what to use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.backend import Backend, BackendConfig
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.trainer import DataParallelTrainer

__all__ = ["HOROVOD_UNAVAILABLE_MESSAGE", "HorovodConfig", "HorovodTrainer"]

HOROVOD_UNAVAILABLE_MESSAGE = (
    "{name} is not available: Horovod's last release (0.28.1) does not build against PyTorch "
    "2.1 or later (it compiles with -std=c++14, and torch's headers require C++17), and Ray "
    "Train V2 removed HorovodTrainer too. TorchTrainer runs the same allreduce data "
    "parallelism with torch.distributed (gloo on CPU, NCCL on GPU).\n"
    "HINT: two lines change:\n"
    "  from phalanx.torch import TorchTrainer, prepare_model   # instead of HorovodTrainer\n"
    "  model = prepare_model(model)   # instead of hvd.init() and hvd.DistributedOptimizer(...)\n"
    "then call TorchTrainer(...) with the same arguments, without horovod_config. "
    "hvd.allreduce(t) becomes torch.distributed.all_reduce(t) (a sum; divide by the world size "
    "for hvd.Average), hvd.rank()/hvd.size() become phalanx.get_context().get_world_rank()/"
    "get_world_size(). See docs/guides/frameworks/horovod.md."
)


class HorovodUnavailableError(ConfigError, DeprecationWarning):
    """Raised by :class:`HorovodTrainer` and :class:`HorovodConfig`.

    A ``DeprecationWarning`` too, as Ray Train V2's ``HorovodTrainer`` raises one: a script
    that catches Ray's error catches this one.
    """


class _HorovodBackend(Backend):
    """Never started: :class:`HorovodConfig` cannot be built."""


@dataclass
class HorovodConfig(BackendConfig):
    """Ray's ``HorovodConfig`` fields; constructing it raises :class:`HorovodUnavailableError`.

    Example::

        HorovodConfig()  # raises HorovodUnavailableError, with the TorchTrainer form to use
    """

    nics: set[str] | None = None
    verbose: int = 1
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_str: str | None = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100

    def __post_init__(self) -> None:
        raise HorovodUnavailableError(HOROVOD_UNAVAILABLE_MESSAGE.format(name="HorovodConfig"))

    @property
    def start_timeout(self) -> float:
        return float(self.timeout_s)

    @property
    def backend_cls(self) -> type[Backend]:
        return _HorovodBackend


class HorovodTrainer(DataParallelTrainer):
    """Ray's ``HorovodTrainer`` signature; constructing it raises
    :class:`HorovodUnavailableError`, which says how to switch to ``TorchTrainer``.

    Example::

        HorovodTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))  # raises
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object],
        *,
        train_loop_config: dict[str, Any] | None = None,
        horovod_config: HorovodConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:  # the base class is never initialised: construction always raises
        raise HorovodUnavailableError(HOROVOD_UNAVAILABLE_MESSAGE.format(name="HorovodTrainer"))
