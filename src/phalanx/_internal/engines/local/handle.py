"""The driver's side of one local worker process: calls sent over its control socket, and what
the pump thread reads back (returns resolve their futures, the hello resolves ``hello``,
reports and notices go to the events queue); signals to the worker or its whole process group.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import cloudpickle

from phalanx._internal.engines.base import WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import (
    Events,
    Exited,
    Hello,
    Poll,
    Preempting,
    Report,
    Return,
    UnknownMessage,
    decode,
)
from phalanx._internal.engines.pending_calls import PendingCalls
from phalanx._internal.engines.rank_output import reader_error
from phalanx._internal.worker.runtime import RemoteCallError, undecodable_error

T = TypeVar("T")


class LocalWorkerHandle(WorkerHandle):
    def __init__(self, index: int, conn: Connection, events: Events) -> None:
        self.index = index
        self.metadata = WorkerMetadata(host="", node_id="local", pid=None)
        self.rank = index
        self.conn = conn  # read by the pump; written here (calls) and by send_exit
        self._events = events
        self._calls = PendingCalls()
        self.stack_file = tempfile.TemporaryFile()  # the worker's faulthandler writes here
        self.returncode: int | None = None
        self.hello = Future[tuple[int, str]]()
        self.broken: RemoteCallError | None = None  # set once a message could not be read

    def execute(self, fn: Callable[..., T], *args: object, **kwargs: object) -> Future[T]:
        future: Future[T] = Future()
        if self.broken is not None:
            future.set_exception(self.broken)
            return future
        call_id = self._calls.add(future)
        payload = cloudpickle.dumps((fn, args, kwargs))
        try:
            self.conn.send_bytes(pickle.dumps(("call", call_id, payload)))
        except OSError as exc:
            self._calls.discard(call_id)
            future.set_exception(ConnectionError(f"worker {self.index} is gone: {exc}"))
        return future

    def reset(
        self, timeout_s: float, reset_worker: Callable[[], None], abort: Callable[[], None] | None
    ) -> Future[Any]:
        """In-place recovery: end the worker's training call and leave the framework's process
        group (``reset_worker``; ``abort`` frees a call waiting in a collective), keeping the
        process; the future holds ``(ok, why)``."""
        future: Future[Any] = Future()
        if self.broken is not None:
            future.set_exception(self.broken)
            return future
        call_id = self._calls.add(future)
        reset = cloudpickle.dumps((reset_worker, (), {}))
        freeing = cloudpickle.dumps((abort, (), {})) if abort is not None else None
        try:
            self.conn.send_bytes(pickle.dumps(("reset", call_id, timeout_s, reset, freeing)))
        except OSError as exc:
            self._calls.discard(call_id)
            future.set_exception(ConnectionError(f"worker {self.index} is gone: {exc}"))
        return future

    def rebind(self, events: Events) -> None:
        """A kept worker serves the next attempt: its events go to that attempt's queue."""
        self._events = events

    # -- called from the pump thread ------------------------------------------------------------

    def on_message(self, data: bytes) -> None:
        try:
            wire = pickle.loads(data)
        except Exception as exc:
            self.fail(undecodable_error(self.rank, data, exc))
            return
        match decode(wire):
            case Return() as ret:
                self._calls.resolve(ret)
            case Hello(pid=pid, host=host):
                self.hello.set_result((pid, host))
            case Report() | Preempting() | Poll() as event:
                self._events.put((self.index, event))
            case other:
                raise UnknownMessage(f"a local worker does not send {type(other).__name__}")

    def on_error(self, exc: BaseException) -> None:
        """Reading or handling this worker's messages failed (in the pump thread)."""
        self.fail(reader_error(self.rank, exc))

    def fail(self, error: RemoteCallError) -> None:
        """Fail every call in flight (and every later one): the driver cannot follow this worker
        any more, and a lost report or return value must not leave fit() waiting forever."""
        self.broken = error
        self._calls.fail_all(error)
        if not self.hello.done():
            self.hello.set_exception(ConnectionError(error.remote.message))

    def on_disconnect(self) -> None:
        error = ConnectionError(f"worker {self.index} (pid {self.metadata.pid}) disconnected")
        self._calls.fail_all(error)
        if not self.hello.done():
            self.hello.set_exception(error)

    def on_exit(self, returncode: int) -> None:
        self.returncode = returncode
        self._events.put((self.index, Exited(returncode)))

    def send_exit(self) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(("exit",)))
        except OSError:
            pass

    def kill(self, force: bool = True) -> None:
        self._signal(signal.SIGKILL if force else signal.SIGTERM)

    def signal_worker(self, sig: int) -> None:
        """Signal the worker process only (not its process group)."""
        if self.metadata.pid is not None and self.returncode is None:
            try:
                os.kill(self.metadata.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _signal(self, sig: int) -> None:
        # Also after the worker exited: what it started in its process group outlives it.
        pid = self.metadata.pid
        if pid is None:
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def is_alive(self) -> bool:
        return self.metadata.pid is not None and self.returncode is None

    def set_rank(self, rank: int) -> None:
        self.rank = rank
