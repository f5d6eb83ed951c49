"""Make the driver safe to fork workers from after it ran torch code.

torch's CPU wheels use GNU OpenMP (libgomp), which is not fork-safe: once the driver has run one
parallel region (a large ``torch.randn``, a matmul, ...), libgomp keeps a pool of threads, and a
process forked afterwards hangs forever in its first parallel region, because it waits for pool
threads that were not copied. phalanx forks its workers from a copy of the driver, so before that
copy is made the pool is released with ``omp_pause_resource_all``; the driver's next parallel
region starts a new pool.
"""

from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["loaded_libraries", "release_openmp_threads"]

logger = logging.getLogger(__name__)

_OMP_PAUSE_HARD = 2


def release_openmp_threads() -> None:
    """Stop the OpenMP thread pool of every libgomp loaded in this process (Linux only)."""
    for path in loaded_libraries("libgomp"):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            pause = lib.omp_pause_resource_all
        except (OSError, AttributeError):  # an old libgomp without OpenMP 5 pause support
            logger.debug("Cannot release the OpenMP threads of %s.", path, exc_info=True)
            continue
        pause.argtypes = [ctypes.c_int]
        pause.restype = ctypes.c_int
        if pause(_OMP_PAUSE_HARD) != 0:
            logger.debug("omp_pause_resource_all failed for %s.", path)


def loaded_libraries(name: str) -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = {line.split(maxsplit=5)[-1] for line in lines if name in line.rsplit("/", 1)[-1]}
    return sorted(p for p in paths if p.startswith("/"))
