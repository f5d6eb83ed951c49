"""How long the training thread waited for its next batch, reported with the next ``report()``.

The dataset iterators add the time each batch took to arrive (``add``); ``report()`` takes the
sum since the last report (``take``) and sends it, so the driver can tell waiting for data from
training (the goodput breakdown). Thread-local: on the thread engine every rank is a thread of
the driver, and a rank's batches are waited for in its own thread.
"""

from __future__ import annotations

import threading

_local = threading.local()


def add(seconds: float) -> None:
    _local.waited = getattr(_local, "waited", 0.0) + seconds


def take() -> float:
    """The seconds waited since the last call in this thread (0.0 when none)."""
    waited: float = getattr(_local, "waited", 0.0)
    if waited:
        _local.waited = 0.0
    return waited
