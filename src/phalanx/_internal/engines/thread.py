"""ThreadEngine: workers are threads in the driver. For fast tests of the controller's logic.

Threads cannot be killed: ``kill`` marks the worker dead and reports it as exited (-9); its thread
keeps running until its current call returns, and its later messages are dropped.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events, Exited, in_process_event
from phalanx._internal.worker.runtime import RemoteCallError, capture_exception, set_outbox
from phalanx._internal.worker.session import thread_sessions
from phalanx.context import PreemptionInfo

T = TypeVar("T")


class _ThreadOutbox:
    def __init__(self, handle: ThreadWorkerHandle, events: Events) -> None:
        self._handle = handle
        self._events = events

    def send(self, message: tuple[Any, ...]) -> None:
        event = in_process_event(message)
        if not self._handle.alive:  # a process would be dead by now: stop the thread's loop
            raise SystemExit(f"worker {self._handle.index} was stopped")
        self._events.put((self._handle.index, event))


class ThreadWorkerHandle(WorkerHandle):
    def __init__(self, index: int, events: Events) -> None:
        self.index = index
        self.metadata = WorkerMetadata(socket.gethostname(), "local", os.getpid())
        self.alive = True
        self._events = events
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(
            target=self._run, name=f"phalanx-worker-{index}", daemon=True
        )
        self._thread.start()
        self.ident: int = self._thread.ident or 0

    def _run(self) -> None:
        set_outbox(_ThreadOutbox(self, self._events), thread_local=True)
        while (item := self._calls.get()) is not None:
            call, future = item
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(RemoteCallError(capture_exception(exc)))

    def execute(self, fn: Callable[..., T], *args: object, **kwargs: object) -> Future[T]:
        future: Future[T] = Future()
        if not self.alive:
            future.set_exception(ConnectionError(f"worker {self.index} is gone"))
        else:
            self._calls.put((lambda: fn(*args, **kwargs), future))
        return future

    def kill(self, force: bool = True) -> None:
        if self.alive:
            self.alive = False
            self._calls.put(None)
            self._events.put((self.index, Exited(-9)))

    def is_alive(self) -> bool:
        return self.alive

    def stop(self) -> None:
        if self.alive:
            self.alive = False
            self._calls.put(None)
            self._events.put((self.index, Exited(0)))


class ThreadEngine(Engine):
    name = "thread"
    process_per_worker = False  # one process: per-process state (a process group) is shared

    def collect_stacks(self, handles: list[WorkerHandle], timeout_s: float) -> dict[int, str]:
        frames = sys._current_frames()
        stacks = {}
        for handle in handles:
            if isinstance(handle, ThreadWorkerHandle) and handle.ident in frames:
                stack = "".join(traceback.format_stack(frames[handle.ident]))
                stacks[handle.index] = f"Thread {handle.ident:#x} (most recent call last):\n{stack}"
        return stacks

    def notify_preemption(self, handles: list[WorkerHandle], notice: dict[str, Any]) -> None:
        info = PreemptionInfo(
            notice["stop_round"], tuple(notice["preempted_ranks"]), notice["deadline"]
        )
        for handle in handles:
            if isinstance(handle, ThreadWorkerHandle) and handle.ident in thread_sessions:
                thread_sessions[handle.ident].preemption = info

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        return [ThreadWorkerHandle(i, events) for i in range(spec.num_workers)]

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        for handle in handles:
            if isinstance(handle, ThreadWorkerHandle):
                handle.stop()
