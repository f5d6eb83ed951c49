"""The worker's channel to the driver, and running calls the driver sends.

A worker is a process (local or Ray engine) or a thread (thread engine). Either way it has one
:class:`Outbox` to send messages to the driver; messages are queued and never wait for the driver.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import threading
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import cloudpickle

from phalanx._internal.worker.report_extras import Wire

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Outbox(Protocol):
    def send(self, message: Wire) -> None: ...


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


def dumps(value: object) -> bytes:
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


UNDECODABLE = "UndecodableMessage"
_PLUMBING = ("builtins.", "copyreg.", "_codecs.", "cloudpickle.", "phalanx.")


def undecodable_error(rank: int, data: bytes, exc: BaseException) -> RemoteCallError:
    """The failure of a worker whose message the driver cannot unpickle: which message, the
    types it holds and the unpickling error. The attempt cannot go on (a report or a return
    value would be lost), so every call in flight on that worker fails with it."""
    kind, types = _pickle_contents(data)
    holds = f" (it holds {', '.join(types)})" if types else ""
    message = (
        f"rank {rank} sent a {kind or 'message'!r} message that the driver cannot load{holds}: "
        f"{type(exc).__name__}: {exc}\nHINT: metrics, return values and exceptions must unpickle "
        "on the driver: an exception class whose __init__ takes other arguments than it passes "
        "to Exception.__init__, or a class from a module only the workers have, cannot. Return "
        "or report plain values (numbers, strings, dicts), or define __reduce__."
    )
    return RemoteCallError(RemoteException(UNDECODABLE, message, "", None))


def _pickle_contents(data: bytes) -> tuple[str | None, list[str]]:
    """The first string of a pickled message (its kind) and the classes it refers to."""
    kind: str | None = None
    names: list[str] = []
    strings: list[str] = []
    memo: list[object] = []
    last: object = None
    try:
        for op, arg, _ in pickletools.genops(data):
            if isinstance(arg, str) and "UNICODE" in op.name:
                kind = kind if kind is not None else arg
                last = arg
                strings.append(arg)
            elif op.name == "MEMOIZE":
                memo.append(last)
            elif op.name in ("BINGET", "LONG_BINGET") and isinstance(arg, int) and arg < len(memo):
                last = memo[arg]
                if isinstance(last, str):
                    strings.append(last)
            elif op.name == "GLOBAL" and isinstance(arg, str):
                names.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            else:
                last = None
    except Exception:  # a truncated or foreign pickle: say what was found so far
        pass
    found = [n for n in dict.fromkeys(names) if not n.startswith(_PLUMBING)]
    return kind, found[:5]


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
