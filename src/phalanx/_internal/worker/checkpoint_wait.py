"""How long the training thread was blocked checkpointing outside ``report()``, reported with
the next ``report()``.

``phalanx.torch.save_state`` adds the time it held the training thread (copying the tensors,
and waiting for an earlier snapshot's write when ``max_pending`` are in flight); ``report()``
takes the sum (``take``) and adds it to the seconds it was itself blocked saving, so the driver
counts both in the goodput's checkpoint part. Thread-local, as ``data_wait``: on the thread
engine every rank is a thread of the driver.
"""

from __future__ import annotations

import threading

_local = threading.local()


def add(seconds: float) -> None:
    _local.blocked = getattr(_local, "blocked", 0.0) + seconds


def take() -> float:
    """The seconds blocked since the last call in this thread (0.0 when none)."""
    blocked: float = getattr(_local, "blocked", 0.0)
    if blocked:
        _local.blocked = 0.0
    return blocked
