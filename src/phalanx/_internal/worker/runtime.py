"""The worker's channel to the driver, and running calls the driver sends.

A worker is a process (local or Ray engine) or a thread (thread engine). Either way it has one
:class:`Outbox` to send messages to the driver; messages are queued and never wait for the driver.
"""

from __future__ import annotations

import os
import pickle
import threading
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import cloudpickle

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Outbox(Protocol):
    def send(self, message: tuple[Any, ...]) -> None: ...


_process_outbox: Outbox | None = None
_local = threading.local()


def set_outbox(outbox: Outbox | None, *, thread_local: bool = False) -> None:
    global _process_outbox
    if thread_local:
        _local.outbox = outbox
    else:
        _process_outbox = outbox


def outbox_is_thread_local() -> bool:
    return getattr(_local, "outbox", None) is not None


def current_outbox() -> Outbox | None:
    return getattr(_local, "outbox", None) or _process_outbox


def dumps(value: Any) -> bytes:
    """Pickle fast when plain pickle can, with cloudpickle for functions and closures."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


@dataclass(frozen=True)
class RemoteException:
    """An exception raised in a worker, carried to the driver as strings (+ the object if it pickles)."""

    type_name: str
    message: str
    traceback: str
    exception: BaseException | None


class RemoteCallError(Exception):
    """A call sent to a worker raised; ``.remote`` holds the details."""

    def __init__(self, remote: RemoteException) -> None:
        super().__init__(f"{remote.type_name}: {remote.message}")
        self.remote = remote


def capture_exception(exc: BaseException) -> RemoteException:
    tb = "".join(traceback.format_exception(type(exc), exc, _user_frames_first(exc.__traceback__)))
    try:
        pickled: BaseException | None = exc
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        pickled = None
    return RemoteException(type(exc).__qualname__, str(exc), tb, pickled)


def _user_frames_first(tb: TracebackType | None) -> TracebackType | None:
    """Drop phalanx's own frames from the top of a traceback, so the user's code comes first."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        first = first.tb_next
    return first or tb


def run_call(payload: bytes) -> tuple[bool, Any]:
    """Run ``(fn, args, kwargs)`` pickled by the driver; returns ``(ok, value or RemoteException)``."""
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        return True, fn(*args, **kwargs)
    except BaseException as exc:  # the driver decides what a failure means
        return False, capture_exception(exc)
