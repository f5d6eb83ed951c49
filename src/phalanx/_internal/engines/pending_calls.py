"""The calls a worker has not answered yet: one home for resolving ``Return`` messages.

Both process engines (local, Ray) send each call with an id and get a :class:`Return` back;
the reader thread resolves the call's future here, while the controller's thread adds calls.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import Any

from phalanx._internal.engines.messages import Return
from phalanx._internal.worker.runtime import RemoteCallError


class PendingCalls:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, Future[Any]] = {}
        self._ids = itertools.count()

    def add(self, future: Future[Any]) -> int:
        """Track ``future``; returns the id its call is sent with."""
        with self._lock:
            call_id = next(self._ids)
            self._calls[call_id] = future
        return call_id

    def discard(self, call_id: int) -> None:
        """The call could not be sent: forget it."""
        with self._lock:
            self._calls.pop(call_id, None)

    def resolve(self, ret: Return) -> None:
        """Set the future of ``ret``'s call: its value, or a RemoteCallError."""
        with self._lock:
            future = self._calls.pop(ret.call_id, None)
        if future is None or future.done():  # failed already (see fail_all())
            return
        if ret.ok:
            future.set_result(ret.value)
        else:
            future.set_exception(RemoteCallError(ret.value))

    def fail_all(self, error: BaseException) -> None:
        """Fail every call in flight: no answer will come (the worker is gone, or unreadable)."""
        with self._lock:
            calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(error)
