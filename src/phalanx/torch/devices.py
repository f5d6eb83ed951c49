"""get_device / get_devices: the torch devices of the current worker."""

from __future__ import annotations

import logging
import os

import torch

import phalanx
from phalanx.errors import SessionMisuseError
from phalanx.torch.environment import device_indices

__all__ = ["get_device", "get_devices"]

logger = logging.getLogger(__name__)


def get_device() -> torch.device:
    """This worker's torch device: its GPU (the lowest id if it has several), or the CPU.

    Inside a training function run with ``use_gpu=True``, each worker on a node sees the GPUs of
    all workers on that node (``CUDA_VISIBLE_DEVICES``), and this returns its own one. Outside a
    training function it returns the current CUDA device, or the CPU.

    Example::

        model = model.to(phalanx.torch.get_device())
    """
    return get_devices()[0]


def get_devices() -> list[torch.device]:
    """All of this worker's torch devices (one per assigned GPU), or ``[cpu]`` without GPUs."""
    try:
        gpu_ids = phalanx.get_context().get_accelerator_ids()
    except SessionMisuseError:  # not in a training worker: plain torch rules
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
    indices = device_indices(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [torch.device("cuda", i) for i in indices]
