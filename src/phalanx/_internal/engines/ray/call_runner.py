"""The calls a Ray actor runs, and how a running call is ended (in-place recovery).

The actor's ``call(seq, payload)`` only queues; :class:`CallRunner` runs the calls on one thread
in ``seq`` order, as the local engine's worker loop does, and sends ``("ret", seq, ok, value)``
to the actor's outbox. Running and ending a call is the engines' shared
:class:`~phalanx._internal.engines.interruptible.InterruptibleCalls`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from phalanx._internal.engines.interruptible import InterruptibleCalls
from phalanx._internal.worker.runtime import capture_exception

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
        self.thread = threading.Thread(target=self._run, name="phalanx-calls", daemon=True)
        self._calls = InterruptibleCalls(self.thread)
        self.thread.start()

    @property
    def _interruptible(self) -> bool:  # for tests: the call's own code runs
        return self._calls._interruptible

    def submit(self, seq: int, payload: bytes) -> None:
        self._calls.received()
        with self._calls.cond:
            self._pending[seq] = payload
            self._calls.cond.notify_all()

    def _run(self) -> None:
        cond = self._calls.cond
        while True:
            with cond:
                while self._next not in self._pending:
                    cond.wait()
                seq, payload = self._next, self._pending.pop(self._next)
                self._next += 1
            ok, value = self._calls.run(payload)
            try:
                self._buffer.send(("ret", seq, ok, value))
            except Exception as exc:  # the return value does not pickle
                self._buffer.send(("ret", seq, False, capture_exception(exc)))
            # An exception holds its traceback's frames, and they the call's objects (a model on
            # the GPU): none of them may outlive the call into the next attempt's.
            value = None
            self._calls.answered()

    def end_current(self, timeout_s: float) -> bool:
        """End the running call; whether this worker is idle (every call received answered)
        within ``timeout_s``."""
        return self._calls.end_current(timeout_s, poll_s=0.1)
