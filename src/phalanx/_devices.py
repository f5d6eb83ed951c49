"""Which torch devices are this worker's: the pure rule, and its application in a worker.

Shared by :mod:`phalanx.torch` (``get_device``) and :mod:`phalanx.data` (``device="auto"`` in
``iter_torch_batches``), so the data package never imports the torch package (and with it the
trainer stack). torch itself is imported only by :func:`torch_devices`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from phalanx._foundation import env
from phalanx.errors import SessionMisuseError

if TYPE_CHECKING:
    import torch

__all__ = ["device_indices", "torch_devices"]

logger = logging.getLogger(__name__)


def device_indices(gpu_ids: Sequence[int], cuda_visible_devices: str | None) -> list[int]:
    """CUDA device indices of this worker's GPUs, lowest physical id first.

    ``gpu_ids`` are physical ids; torch numbers devices by their position in
    ``CUDA_VISIBLE_DEVICES`` (or by physical id when it is unset).

    >>> device_indices([3], "2,3")
    [1]
    """
    ids = sorted(gpu_ids)
    if cuda_visible_devices is None:
        return ids
    visible = [item.strip() for item in cuda_visible_devices.split(",") if item.strip()]
    missing = [i for i in ids if str(i) not in visible]
    if missing:
        raise RuntimeError(
            f"This worker was assigned GPU(s) {ids} but CUDA_VISIBLE_DEVICES="
            f"{cuda_visible_devices!r} does not include {missing}.\n"
            "HINT: do not change CUDA_VISIBLE_DEVICES inside the training function; phalanx "
            "sets it for each worker."
        )
    return [visible.index(str(i)) for i in ids]


def torch_devices() -> list[torch.device]:
    """This worker's torch devices (one per assigned GPU), ``[cpu]`` without GPUs, and outside
    a training function the current CUDA device or the CPU (plain torch rules)."""
    import torch

    from phalanx.session import get_context

    try:
        gpu_ids = get_context().get_accelerator_ids()
    except SessionMisuseError:  # not in a training worker
        if torch.cuda.is_available():
            return [torch.device("cuda", torch.cuda.current_device())]
        return [torch.device("cpu")]
    if not gpu_ids:
        return [torch.device("cpu")]
    if not torch.cuda.is_available():
        logger.warning(
            "This worker was given GPU(s) %s but torch cannot use CUDA here; using the CPU. "
            "HINT: check that this torch build has CUDA (torch.version.cuda) and the driver works.",
            gpu_ids,
        )
        return [torch.device("cpu")]
    indices = device_indices(gpu_ids, env.cuda_visible_devices())
    return [torch.device("cuda", i) for i in indices]
