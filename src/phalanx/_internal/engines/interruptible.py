"""A worker's calls, run one at a time on one thread, and how another thread ends the one that runs.

Both engines' workers serve the driver's calls this way: the local engine's worker process on its
main thread (engines/local/worker_main.py), the Ray actor on a thread of its own
(engines/ray/call_runner.py). In-place recovery ends the running call: the session's next
``report()`` raises :class:`AttemptInterrupted`, and so does the call's own Python code at its next
instruction (``PyThreadState_SetAsyncExc``); a call blocked in C code (a collective, a sleep) ends
only when that returns. An interrupt can land nowhere but inside the call's own code.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import cloudpickle

from phalanx._internal.worker.runtime import capture_exception
from phalanx._internal.worker.session import AttemptInterrupted, get_session


class InterruptibleCalls:
    """The count of calls received and not answered, and the one that runs, for :meth:`end_current`.

    ``cond`` guards the count and the flag; an engine may wait on it for its own state too (the Ray
    actor's out-of-order calls). ``thread`` is the one that runs the calls.
    """

    def __init__(self, thread: threading.Thread) -> None:
        self.cond = threading.Condition()
        self.thread = thread
        self._busy = 0  # calls received whose answer is not sent yet
        self._interruptible = False  # the call's own code runs: an interrupt lands inside it

    def received(self) -> None:
        """A call arrived: counted from now, so an ``end_current`` waits for it too."""
        with self.cond:
            self._busy += 1

    def answered(self) -> None:
        """The answer of the call that ran is sent."""
        with self.cond:
            self._busy -= 1
            self.cond.notify_all()

    def run(self, payload: bytes) -> tuple[bool, Any]:
        """Run a pickled ``(fn, args, kwargs)`` on :attr:`thread`; ``(ok, value or captured
        exception)``. Interruptible only while ``fn`` runs: the flag is cleared under the lock
        that the interrupter holds, then an interrupt still pending is dropped."""
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            with self.cond:
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
                with self.cond:
                    self._interruptible = False
                return
            except AttemptInterrupted:  # landed on the way out: the flag is cleared next try
                continue

    def end_current(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """End the running call; whether every call received is answered within ``timeout_s``."""
        session = get_session()
        if session is not None:
            session.interrupted = True
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self._busy and time.monotonic() < deadline:
                if self._interruptible:
                    async_raise(self.thread, AttemptInterrupted)
                self.cond.wait(min(poll_s, max(0.0, deadline - time.monotonic())))
            return not self._busy


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
            async_raise(threading.current_thread(), _Dropped)
            while True:  # delivered at the next check of the eval loop
                pass
        except _Dropped:
            return
        except AttemptInterrupted:  # an interrupt landed before ours was set: set ours again
            continue


def async_raise(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
        )
