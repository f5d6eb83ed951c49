"""Keep the objects that existed before ``fit()`` out of the garbage collector while it runs.

``import torch`` leaves ~170k tracked objects and the collector one step short of a full pass
over them: the next ~8,000 allocations of anyone pay it (tens of milliseconds). Inside ``fit()`` those
allocations are phalanx's (its run machinery is imported there) and the pass would land between
``fit()`` and the first line of the training function. Frozen (``gc.freeze``), the objects the
user's program already had are skipped by every collection until ``fit()`` returns, when they are
handed back (``gc.unfreeze``), so the process is as it was. They are objects the program still
refers to: nothing collectable is kept alive that ``fit()`` frees. Processes forked during the
run (the fork server and its workers) inherit the freeze, which is what Python's documentation
recommends before a fork: their collections never write to the parent's objects, so those pages
stay shared.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def objects_before_frozen() -> Iterator[None]:
    # The program manages the collector itself (froze objects, or disabled it): leave it alone.
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
