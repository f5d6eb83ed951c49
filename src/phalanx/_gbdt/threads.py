"""OpenMP and the fork server; how many threads each boosting worker uses.

XGBoost and LightGBM run their loops in GNU OpenMP (libgomp), which is not fork-safe: once a
process ran one parallel region, a child forked from it hangs in its first parallel region. The
driver often trains a baseline before ``fit()`` (or probes ``params``), and phalanx forks its
workers from a copy of the driver, so the pool is released first
(:mod:`phalanx._internal.engines.local.fork_safety`, which this module shares).

Without a thread count, both libraries use every core in every worker, and N workers on one
node fight over the same cores. :func:`default_threads` sets the OpenMP default of the thread
that runs the training function to this worker's share (an explicit ``nthread`` /
``num_threads`` in ``params`` still wins).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator

from phalanx._internal.engines.local.fork_safety import loaded_libraries

__all__ = ["cpu_share", "default_threads"]

logger = logging.getLogger(__name__)


def cpu_share(cpus_per_worker: float | None, local_world_size: int) -> int:
    """Threads a worker should use: its ``CPU`` resource if given, else an equal share of the
    cores this process may run on (never below 1)."""
    if cpus_per_worker:
        return max(1, int(cpus_per_worker))
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


@contextlib.contextmanager
def default_threads(n: int) -> Iterator[None]:
    """Within the block, parallel regions started by this thread use ``n`` threads unless the
    library is told otherwise (``omp_set_num_threads`` on every loaded libgomp)."""
    previous = []
    for lib in _libgomps():
        get, set_ = lib.omp_get_max_threads, lib.omp_set_num_threads
        get.restype = ctypes.c_int
        set_.argtypes = [ctypes.c_int]
        previous.append((set_, int(get())))
        set_(n)
    try:
        yield
    finally:
        for set_, value in previous:
            set_(value)


def _libgomps() -> list[ctypes.CDLL]:
    libs = []
    for path in loaded_libraries("libgomp"):
        try:
            libs.append(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
        except OSError:
            logger.debug("Cannot open the loaded OpenMP runtime %s.", path, exc_info=True)
    return libs
