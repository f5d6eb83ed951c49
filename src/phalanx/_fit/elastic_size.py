"""Elastic training (``ScalingConfig(num_workers=(min, max))``) outside Ray: the size is decided
once, at ``fit()``, from what this machine has.

On Ray the size is decided per attempt by the engine, from what the cluster can place; a local
machine does not gain or lose CPUs during a run, so one decision at the start is the whole story.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

from phalanx.config import ScalingConfig
from phalanx.errors import ConfigError

logger = logging.getLogger(__name__)


def local_capacity(scaling: ScalingConfig) -> tuple[int, str]:
    """How many workers of ``scaling``'s size this machine holds, and what limits it (for
    messages): its GPUs with ``use_gpu=True``, its CPUs otherwise."""
    if scaling.use_gpu:
        from phalanx._internal.engines.local.resources import visible_gpu_ids

        gpus = len(visible_gpu_ids())
        per = scaling.num_gpus_per_worker
        return _fits(gpus, per, scaling.max_workers), f"{gpus} visible GPU(s), {per:g} per worker"
    cpus = os.cpu_count() or 1
    per = scaling.num_cpus_per_worker
    return _fits(cpus, per, scaling.max_workers), f"{cpus} CPU(s), {per:g} per worker"


def _fits(have: int, per_worker: float, cap: int) -> int:
    if per_worker <= 0:  # a worker that asks for none of it is not limited by it
        return cap
    return math.floor(have / per_worker + 1e-9)


def resolve_locally(scaling: ScalingConfig) -> ScalingConfig:
    """``scaling`` with ``num_workers`` fixed at what this machine allows, clamped to
    ``[min_workers, max_workers]``; ConfigError when even ``min_workers`` do not fit."""
    if not scaling.elasticity_enabled:
        return scaling
    low, high = scaling.min_workers, scaling.max_workers
    capacity, what = local_capacity(scaling)
    if capacity < low:
        raise ConfigError(
            f"ScalingConfig(num_workers=({low}, {high})) needs at least {low} local workers, "
            f"but this machine holds {capacity} ({what}).\nHINT: lower min_workers, lower the "
            "resources per worker, or run on a Ray cluster (ray.init(address=...))."
        )
    size = min(high, capacity)
    logger.info(
        "Elastic num_workers=(%d, %d): starting %d local worker%s (%s)",
        low,
        high,
        size,
        "" if size == 1 else "s",
        what,
    )
    return dataclasses.replace(scaling, num_workers=size)
