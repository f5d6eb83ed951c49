"""get_device / get_devices: the torch devices of the current worker."""

from __future__ import annotations

import torch

from phalanx._devices import torch_devices

__all__ = ["get_device", "get_devices"]


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
    """All of this worker's torch devices (one per assigned GPU), or ``[cpu]`` without GPUs.

    Example::

        devices = phalanx.torch.get_devices()  # ScalingConfig(resources_per_worker={"GPU": 2})
        encoder, decoder = encoder.to(devices[0]), decoder.to(devices[-1])
    """
    return torch_devices()
