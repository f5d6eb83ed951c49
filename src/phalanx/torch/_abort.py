"""Ending a rank's collectives from outside: abort this worker's process group within a deadline.

A rank whose peer vanished without closing its sockets (the peer's host was cut off: no FIN, no
RST) waits in its collective until the process group's timeout (``TorchConfig.timeout_s``, 30
minutes by default). Its training call cannot be ended while it waits in C++, so in-place recovery
would have to replace a perfectly healthy process. :func:`abort_process_group`, called from
another thread of the worker, makes that collective raise at once:

- NCCL: ``_abort_process_group()`` aborts the communicators (``ncclCommAbort``), which ends the
  kernels and host waits of every collective in flight;
- gloo: ``ProcessGroupGloo.abort()`` does not end a collective in flight (torch 2.13: it returns
  and the ``allreduce`` goes on waiting), so the group's pair sockets are shut down instead: each
  waiting read fails at once ("Connection closed by peer") and the collective raises. The
  sockets are those the process opened while it joined the group (:func:`tracking_sockets`
  records them around ``init_process_group``); the listening socket is left alone (gloo aborts
  the process when its ``accept`` fails) and so are the store's connections.

The group itself is destroyed afterwards by the usual teardown (``destroy_process_group``, the
backend's ``reset_worker``), in the thread that used it. Issue 44 (peer recovery) aborts the
same way before the survivors hand their state over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 5.0

_lock = threading.Lock()
_group_sockets: set[int] = set()  # inodes of the sockets opened while joining the group
_store_port: int | None = None  # the store's: its connections are not the group's


def _socket_inodes() -> dict[int, int]:
    """fd -> socket inode of every socket this process holds now."""
    found = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:  # no procfs (macOS): nothing to shut down
        return {}
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(fd)] = int(target[8:-1])
    return found


@contextlib.contextmanager
def tracking_sockets(store_port: int) -> Iterator[None]:
    """Record the sockets opened inside the block as the process group's (around
    ``init_process_group``); ``store_port``: the store's port, whose connections are kept."""
    global _store_port
    before = set(_socket_inodes().values())
    try:
        yield
    finally:
        opened = set(_socket_inodes().values()) - before
        with _lock:
            _group_sockets.clear()
            _group_sockets.update(opened)
            _store_port = store_port


def forget_sockets() -> None:
    """The group is gone (destroyed): its sockets are no longer the group's."""
    with _lock:
        _group_sockets.clear()


def abort_process_group(timeout_s: float = ABORT_TIMEOUT_S) -> bool:
    """Make every collective in flight on this worker's default process group raise, within
    ``timeout_s``; returns whether the abort finished in time. Does nothing (and returns True)
    where no group exists. Call it from a thread other than the one in the collective; destroy
    the group afterwards in the usual way.

    Example (a worker's watchdog thread; the training thread's ``all_reduce`` then raises)::

        from phalanx.torch._abort import abort_process_group

        if peer_lost:
            abort_process_group(timeout_s=5.0)
    """
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            _abort()
        except BaseException as exc:  # reported by the caller's thread below
            failure.append(exc)
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=run, name="phalanx-pg-abort", daemon=True).start()
    finished = done.wait(timeout_s)
    if failure:
        logger.warning("Aborting the process group failed: %r", failure[0])
        return False
    logger.debug(
        "process group aborted in %.3f s (finished: %s)", time.monotonic() - started, finished
    )
    return finished


def _abort() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if _uses_nccl():
        from torch.distributed import distributed_c10d

        distributed_c10d._abort_process_group()
    shut = _shut_down_group_sockets()
    logger.debug("shut down %d socket(s) of the process group", shut)


def _uses_nccl() -> bool:
    import torch
    from torch.distributed import distributed_c10d

    try:
        group = distributed_c10d._get_default_group()
        backend = group._get_backend(torch.device("cuda"))
    except (RuntimeError, ValueError, AttributeError):
        return False
    return type(backend).__name__ == "ProcessGroupNCCL"


def _shut_down_group_sockets() -> int:
    """shutdown(2) each connected TCP socket of the group (not its listener, not the store's);
    how many were shut down."""
    with _lock:
        wanted, store_port = set(_group_sockets), _store_port
    shut = 0
    for fd, inode in _socket_inodes().items():
        if inode not in wanted:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed meanwhile
            continue
        with sock:
            if _is_group_connection(sock, store_port):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
    return shut


def _is_group_connection(sock: socket.socket, store_port: int | None) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return False
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False  # the listener: gloo aborts the process when its accept fails
        peer, local = sock.getpeername(), sock.getsockname()
    except OSError:  # not connected
        return False
    return store_port not in (peer[1], local[1])
