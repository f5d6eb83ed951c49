"""Lightning strategies whose device and data split are phalanx's: DDP, FSDP, DeepSpeed.

Lightning's strategies assume Lightning started the processes, one per entry of ``devices``:
a rank's device is ``parallel_devices[local_rank]`` and the sampler splits data into
``num_nodes * len(devices)`` parts. Inside a phalanx worker, ``devices="auto"`` lists what this
worker sees (one CPU; or its node's GPUs), so Lightning's DDP fails with
``IndexError: list index out of range`` on local rank 1. These subclasses take the device from
:func:`phalanx.torch.get_device` and the split from the run's world size and rank. The process
group is phalanx's (``TorchConfig``); Lightning finds it initialised and keeps it.
"""

from __future__ import annotations

import importlib.util

import torch

from phalanx.lightning._flavour import import_lightning
from phalanx.torch._devices import get_device

__all__ = ["RayDDPStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy"]

pl = import_lightning()

DEEPSPEED_HINT = 'HINT: pip install "phalanx[deepspeed]" (or pip install deepspeed).'


class _RayPlacement:
    """The two properties every phalanx strategy overrides (a mixin placed first in the MRO)."""

    world_size: int
    global_rank: int

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


# Base classes of the Lightning flavour found at import: mypy sees a module object.
class RayDDPStrategy(_RayPlacement, pl.strategies.DDPStrategy):  # type: ignore[misc,name-defined]
    """Lightning's ``DDPStrategy`` for a phalanx worker; takes the same arguments.

    ``process_group_backend`` and ``timeout`` have no effect (the group already exists): set
    them with ``TorchConfig(backend=..., timeout_s=...)``, as in Ray Train.

    Example::

        trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()])
    """


# Base classes of the Lightning flavour found at import: mypy sees a module object.
class RayFSDPStrategy(_RayPlacement, pl.strategies.FSDPStrategy):  # type: ignore[misc,name-defined]
    """Lightning's ``FSDPStrategy`` for a phalanx worker; takes the same arguments
    (``sharding_strategy``, ``auto_wrap_policy``, ``state_dict_type``...).

    Example::

        trainer = pl.Trainer(
            strategy=RayFSDPStrategy(), plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()], devices="auto", accelerator="auto",
        )
        trainer = prepare_trainer(trainer)
    """


# Base classes of the Lightning flavour found at import: mypy sees a module object.
class RayDeepSpeedStrategy(_RayPlacement, pl.strategies.DeepSpeedStrategy):  # type: ignore[misc,name-defined]
    """Lightning's ``DeepSpeedStrategy`` for a phalanx worker; needs the ``deepspeed`` package.

    Example::

        trainer = pl.Trainer(
            strategy=RayDeepSpeedStrategy(), plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()], devices="auto", accelerator="auto",
        )
        trainer = prepare_trainer(trainer)
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ModuleNotFoundError(
                "RayDeepSpeedStrategy needs DeepSpeed, which is not installed in this "
                f"environment.\n{DEEPSPEED_HINT} Or use RayDDPStrategy / RayFSDPStrategy."
            )
        super().__init__(*args, **kwargs)
