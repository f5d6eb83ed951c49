"""Linux calls the standard library lacks: ``syncfs(2)`` and ``renameat2(RENAME_NOREPLACE)``.

One ``syncfs(2)`` for a commit instead of one fsync per file, where it can be relied on.

A checkpoint with a part from every rank had to flush each part's files and directories before
the rename that makes it visible: O(parts) disk round trips, even with the fsyncs in threads.
``syncfs`` flushes the filesystem that holds the checkpoint in one call, whatever the number of
parts. It reports a write-back error only since Linux 5.8;
before that, and off Linux, phalanx keeps the per-file fsyncs.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import sys
from collections.abc import Callable
from typing import Any


def _libc_function(name: str) -> Any:
    """The C library's function ``name`` on Linux (errno kept for ``ctypes.get_errno``), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def _syncfs_call() -> Callable[[int], int] | None:
    try:
        release = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return None
    if release < (5, 8):  # syncfs returned 0 even when writing back failed
        return None
    call = _libc_function("syncfs")
    if call is None:
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


@functools.cache
def _renameat2_call() -> Callable[[int, bytes, int, bytes, int], int] | None:
    call = _libc_function("renameat2")  # glibc >= 2.28
    if call is None:
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def rename_no_replace(src: str, dst: str) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists, atomically. False where the kernel or libc
    cannot promise that (nothing was done). OSError (EEXIST when ``dst`` exists) otherwise.

    A plain rename of a directory onto an existing *empty* directory replaces it: another rank
    that has just created that directory for its own part would then write into a directory
    that no longer exists (ENOENT)."""
    call = _renameat2_call()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL):  # no renameat2, or the filesystem lacks it
            return False
        raise OSError(code, os.strerror(code), src, None, dst)
    return True


def syncfs(path: str) -> bool:
    """Flush everything written to the filesystem holding ``path``. False where syncfs cannot be
    relied on (nothing was done: flush file by file). OSError when a write-back failed."""
    call = _syncfs_call()
    if call is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if call(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
    finally:
        os.close(fd)
    return True
