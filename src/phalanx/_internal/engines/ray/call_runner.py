"""The calls a Ray actor runs, and how a running call is ended (in-place recovery).

The actor's ``call(seq, payload)`` only queues; :class:`CallRunner` runs the calls on one thread
in ``seq`` order, as the local engine's worker loop does, and sends ``("ret", seq, ok, value)``
to the actor's outbox. Ending a call raises :class:`AttemptInterrupted` in that thread
(``PyThreadState_SetAsyncExc``), only while the call's own code runs.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import TYPE_CHECKING, Any

import cloudpickle

from phalanx._internal.worker.runtime import capture_exception
from phalanx._internal.worker.session import AttemptInterrupted, get_session

if TYPE_CHECKING:
    from phalanx._internal.engines.ray.actor import MessageBuffer


class CallRunner:
    """Runs calls one at a time in ``seq`` order (they may arrive out of order on Ray's threads).

    ``end_current`` ends the call that runs (in-place recovery): the session's next ``report()``
    raises, and so does the call's own code at its next Python instruction; a call blocked in C
    (a collective, a sleep) ends only when that returns.
    """

    def __init__(self, buffer: MessageBuffer) -> None:
        self._buffer = buffer
        self._pending: dict[int, bytes] = {}
        self._next = 0
        self._cond = threading.Condition()
        self._running = False  # a call is taken and its answer not sent yet
        self._interruptible = False  # the call's own code runs: an interrupt lands inside it
        self.thread = threading.Thread(target=self._run, name="phalanx-calls", daemon=True)
        self.thread.start()

    def submit(self, seq: int, payload: bytes) -> None:
        with self._cond:
            self._pending[seq] = payload
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next not in self._pending:
                    self._cond.wait()
                seq, payload = self._next, self._pending.pop(self._next)
                self._next += 1
                self._running = True
            ok, value = self._call(payload)
            try:
                self._buffer.send(("ret", seq, ok, value))
            except Exception as exc:  # the return value does not pickle
                self._buffer.send(("ret", seq, False, capture_exception(exc)))
            # An exception holds its traceback's frames, and they the call's objects (a model on
            # the GPU): none of them may outlive the call into the next attempt's.
            value = None
            with self._cond:
                self._running = False
                self._cond.notify_all()

    def _call(self, payload: bytes) -> tuple[bool, Any]:
        """``run_call``, interruptible only while the call's code runs: an interrupt can land
        nowhere but inside this ``try`` (the flag is cleared under the lock the interrupter
        holds, then a pending interrupt is cancelled)."""
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            with self._cond:
                self._interruptible = True
            try:
                value = fn(*args, **kwargs)
            finally:
                self._leave_interruptible()
                _drop_pending_interrupt()
            return True, value
        except BaseException as exc:  # the driver decides what a failure means
            return False, capture_exception(exc)

    def _leave_interruptible(self) -> None:
        while True:
            try:
                with self._cond:
                    self._interruptible = False
                return
            except AttemptInterrupted:  # landed on the way out: the flag is cleared next try
                continue

    def end_current(self, timeout_s: float) -> bool:
        """End the running call; whether this worker is idle (no call runs) within ``timeout_s``."""
        session = get_session()
        if session is not None:
            session.interrupted = True
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._running and time.monotonic() < deadline:
                if self._interruptible:
                    _async_raise(self.thread, AttemptInterrupted)
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self._running and not self._pending


class _Dropped(BaseException):
    """Raised in the calling thread by :func:`_drop_pending_interrupt`, and caught there."""


def _drop_pending_interrupt() -> None:
    """Drop an interrupt that did not land, in the calling thread.

    Not by ``PyThreadState_SetAsyncExc(thread, NULL)``: CPython then leaves the interpreter's
    "asynchronous exception pending" signal set with nothing to deliver, and every traced call
    (a debugger, coverage) spins forever at its first line. Delivering an exception of our own
    to this thread replaces the pending one and clears the signal, and it is caught here.
    """
    while True:
        try:
            _async_raise(threading.current_thread(), _Dropped)
            while True:  # delivered at the next check of the eval loop
                pass
        except _Dropped:
            return
        except AttemptInterrupted:  # an interrupt landed before ours was set: set ours again
            continue


def _async_raise(thread: threading.Thread, exc_type: type[BaseException] | None) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (None: cancel that)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type) if exc_type else None
        )
