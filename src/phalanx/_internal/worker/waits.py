"""Seconds a training thread waited for something, summed per thread until ``report()`` takes
them (``data_wait``: batches; ``checkpoint_wait``: save_state). Per thread because on the thread
engine every rank is a thread of the driver."""

from __future__ import annotations

import threading


class WaitTotal:
    def __init__(self) -> None:
        self._local = threading.local()

    def add(self, seconds: float) -> None:
        self._local.total = getattr(self._local, "total", 0.0) + seconds

    def take(self) -> float:
        """The seconds added in this thread since its last ``take`` (0.0 when none)."""
        total: float = getattr(self._local, "total", 0.0)
        if total:
            self._local.total = 0.0
        return total
