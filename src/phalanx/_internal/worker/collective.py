"""Barrier and broadcast through the run's storage.

Every rank of every engine can read and write the run's storage (phalanx checks that at
start-up), so it is the one channel that needs nothing else: no port, no process group, no
driver round trip. Files live in ``.staging/collective/attempt_<n>/<seq>/`` and go when the run
or the attempt ends. Each call of each rank gets the next sequence number, so calls match up by
order, as collectives do. A rank waits by polling, quickly at first, then every 50 ms.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, TypeVar

import cloudpickle

from phalanx._internal.storage.run_storage import STAGING_DIR
from phalanx._internal.worker.step_anatomy import collective_wait

if TYPE_CHECKING:
    from phalanx._internal.storage.run_storage import RunStorage
    from phalanx._internal.worker.session import Session

logger = logging.getLogger(__name__)

FIRST_POLL_S = 0.001
MAX_POLL_S = 0.05
WARN_EVERY_S = 60.0

_Data = TypeVar("_Data")


def _next_dir(session: Session) -> str:
    seq = session.collective_seq
    session.collective_seq = seq + 1
    return f"{STAGING_DIR}/collective/attempt_{session.attempt}/{seq:06d}"


def barrier_on(session: Session) -> None:
    context = session.context
    if context.world_size == 1:
        return
    directory = _next_dir(session)
    storage = session.storage
    _ensure_dir(storage, directory)
    storage.write_atomic(f"{directory}/rank_{context.world_rank}", b"")
    for rank in range(context.world_size):
        _wait_for(storage, f"{directory}/rank_{rank}", "barrier", rank)


def broadcast_on(session: Session, data: _Data) -> _Data:
    context = session.context
    if context.world_size == 1:
        return data
    directory = _next_dir(session)
    storage = session.storage
    path = f"{directory}/data"
    if context.world_rank == 0:
        try:
            payload = cloudpickle.dumps(data)
        except Exception as exc:
            raise TypeError(
                f"broadcast_from_rank_zero(data) cannot pickle {type(data).__name__}: {exc}\n"
                "HINT: broadcast plain data (numbers, strings, lists, dicts, arrays)."
            ) from exc
        _ensure_dir(storage, directory)
        storage.write_atomic(path, payload)
        return data
    return cloudpickle.loads(_wait_for(storage, path, "broadcast_from_rank_zero", 0))


def _ensure_dir(storage: RunStorage, directory: str) -> None:
    storage.filesystem.makedirs(storage.path(directory), exist_ok=True)


def _wait_for(storage: RunStorage, relative: str, what: str, rank: int) -> bytes:
    """The file once it is there; the wait counts as a collective wait (the step anatomy)."""
    began = time.perf_counter()
    try:
        return _poll(storage, relative, what, rank)
    finally:
        collective_wait.add(time.perf_counter() - began)


def _poll(storage: RunStorage, relative: str, what: str, rank: int) -> bytes:
    delay, started, warned = FIRST_POLL_S, time.monotonic(), 0.0
    while (data := storage.read(relative)) is None:
        time.sleep(delay)
        delay = min(delay * 2, MAX_POLL_S)
        waited = time.monotonic() - started
        if waited - warned >= WARN_EVERY_S:
            warned = waited
            logger.warning("%s has waited %.0f s for rank %d to call it too.", what, waited, rank)
    return data
