"""prepare_model and enable_reproducibility."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

import phalanx.session as session
from phalanx._foundation import env
from phalanx.errors import ConfigError
from phalanx.torch import _amp as amp
from phalanx.torch._anatomy import install_step_clock
from phalanx.torch._devices import get_device
from phalanx.torch._replicas import check_replica_setting, install_replica_check

__all__ = ["enable_reproducibility", "prepare_model", "reproducibility_seed"]

logger = logging.getLogger(__name__)

PARALLEL_STRATEGIES = ("ddp", "fsdp", None)

_seed: int | None = None


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
    *,
    replica_check: bool | int = True,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it for data-parallel training.

    With more than one worker the model is wrapped in ``DistributedDataParallel`` (``"ddp"``)
    or ``FullyShardedDataParallel`` (``"fsdp"``; on CPU too, with gloo), given
    ``parallel_strategy_kwargs``; ``None`` leaves it unwrapped. ``move_to_device`` may name a
    device instead of this worker's own.

    The wrapped model reports where each step's time goes (waiting for the other ranks in the
    gradient collectives), so a slow rank is named with its cause even though every rank waits
    for it. ``replica_check``: DDP replicas (and the replicated dimension of hybrid-sharded
    FSDP) are compared by a checksum at every round in which the ranks pass a checkpoint, and
    a round whose replicas differ is not committed; ``N`` also compares every ``N`` rounds,
    ``False`` never (or ``PHALANX_REPLICA_CHECK=0``).

    Example::

        model = phalanx.torch.prepare_model(nn.Linear(784, 10))
    """
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ConfigError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is invalid: it must be "
            "'ddp', 'fsdp' or None."
        )
    kwargs = dict(parallel_strategy_kwargs or {})
    every = check_replica_setting(replica_check)
    ctx = session.get_context()
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if move_to_device:
        model = model.to(device)
    if amp.amp_enabled():
        model.forward = amp.AutocastForward(model.forward, device.type)  # type: ignore[method-assign]
    amp.mark_prepared()
    if parallel_strategy is None or ctx.get_world_size() == 1:
        return model
    if parallel_strategy == "ddp":
        if device.type != "cpu":
            kwargs = {"device_ids": [device], "output_device": device, **kwargs}
        wrapped: torch.nn.Module = DistributedDataParallel(model, **kwargs)
    else:
        wrapped = _wrap_fsdp(model, device, kwargs)
    install_step_clock(wrapped)
    install_replica_check(wrapped, every)
    return wrapped


def _wrap_fsdp(model: torch.nn.Module, device: torch.device, kwargs: dict[str, Any]) -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel

    # FSDP looks for an accelerator unless told the device; on CPU (gloo) it must be told.
    kwargs.setdefault("device_id", device)
    return FullyShardedDataParallel(model, **kwargs)


def enable_reproducibility(seed: int = 0) -> None:
    """Limit sources of randomness and nondeterminism on this worker.

    Seeds torch, ``random`` and NumPy; makes torch use deterministic algorithms; turns off cuDNN
    benchmarking; sets ``CUBLAS_WORKSPACE_CONFIG``; and seeds the DataLoader workers and shuffling
    of loaders prepared afterwards by :func:`prepare_data_loader`. Results can still differ
    across hardware and library versions.

    Example::

        phalanx.torch.enable_reproducibility(seed=42)
    """
    global _seed
    _seed = seed
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # Deterministic cuBLAS needs a fixed workspace; without it torch raises on CUDA.
    env.set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def reproducibility_seed() -> int | None:
    """The seed given to :func:`enable_reproducibility` in this worker, if any."""
    return _seed
