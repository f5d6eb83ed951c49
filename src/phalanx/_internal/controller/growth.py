"""Elastic growth: when a running elastic group checks whether the cluster can now place more
workers (Ray Train's resize check, every ``elastic_resize_monitor_interval_s``), and the line
the controller logs when it restarts the group larger."""

from __future__ import annotations

import time

from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.engines.base import Engine
from phalanx.config import ScalingConfig


class GrowthCheck:
    """Asks the engine at most once per interval since the attempt started."""

    def __init__(self, scaling: ScalingConfig, engine: Engine) -> None:
        self.scaling = scaling
        self.engine = engine
        self.last_check = 0.0  # time.monotonic() of the last check

    def can_grow(self, attempt: Attempt) -> bool:
        """Elastic, below max_workers, an interval since the last check: can the engine now
        place more workers?"""
        size = len(attempt.group)
        if not self.scaling.elasticity_enabled or size >= self.scaling.max_workers:
            return False
        now = time.monotonic()
        if now - max(attempt.started, self.last_check) < (
            self.scaling.elastic_resize_monitor_interval_s
        ):
            return False
        self.last_check = now
        return self.engine.free_worker_slots(self.scaling) > 0

    def grow_line(self, size: int) -> str:
        return (
            f"Elastic: the cluster can place more than the {size} running workers "
            f"(max_workers={self.scaling.max_workers}): restarting the group larger from the "
            "latest checkpoint (not counted as a failure)."
        )
