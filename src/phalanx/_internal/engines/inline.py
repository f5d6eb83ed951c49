"""InlineEngine: ``ScalingConfig(num_workers=0)``, the training function runs in the thread that
called ``fit()``, as Ray Train's local mode does.

One worker of world size 1 whose calls run at once, in the caller's thread, so ``breakpoint()``
and IDE debuggers stop inside the training function. No process group and no framework
backend is set up (a single process has no peers). Each report is committed as it is made:
the controller's event pump runs inside ``report()``, so checkpoints, retention, callbacks and
``get_all_reported_checkpoints()`` behave as with workers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from phalanx._foundation.run_scope import RunStopped
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events, Exited, in_process_event
from phalanx._internal.worker.runtime import RemoteCallError, capture_exception, set_outbox
from phalanx._internal.worker.session import clear_thread_session

T = TypeVar("T")


class _InlineOutbox:
    def __init__(self, events: Events, engine: InlineEngine) -> None:
        self._events = events
        self._engine = engine

    def send(self, message: tuple[Any, ...]) -> None:
        event = in_process_event(message)
        self._events.put((0, event))
        if self._engine.pump is not None:
            self._engine.pump()


class InlineWorkerHandle(WorkerHandle):
    def __init__(self, events: Events) -> None:
        self.index = 0
        self.metadata = WorkerMetadata(socket.gethostname(), "local", os.getpid())
        self.alive = True
        self._events = events

    def execute(self, fn: Callable[..., T], *args: object, **kwargs: object) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a worker would: the controller decides what it means
            if isinstance(exc, KeyboardInterrupt | RunStopped):
                raise  # Ctrl-C in the driver (or a stop from a callback) stops fit()
            future.set_exception(RemoteCallError(capture_exception(exc)))
        return future

    def kill(self, force: bool = True) -> None:
        self.stop(-9)

    def is_alive(self) -> bool:
        return self.alive

    def stop(self, returncode: int = 0) -> None:
        if self.alive:
            self.alive = False
            self._events.put((0, Exited(returncode)))


class InlineEngine(Engine):
    name = "inline"
    in_process = True
    process_per_worker = False

    def __init__(self) -> None:
        self.pump: Callable[[], None] | None = None

    def set_event_pump(self, pump: Callable[[], None] | None) -> None:
        self.pump = pump

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        set_outbox(_InlineOutbox(events, self), thread_local=True)
        return [InlineWorkerHandle(events)]

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        for handle in handles:
            if isinstance(handle, InlineWorkerHandle):
                handle.stop()
        self._forget_worker()

    def close(self) -> None:
        self.pump = None
        self._forget_worker()

    @staticmethod
    def _forget_worker() -> None:
        """The caller's thread is the driver again: report() outside fit() is an error."""
        set_outbox(None, thread_local=True)
        clear_thread_session()
