"""The driver side of one Ray actor: its calls, its messages, its death.

A :class:`RayWorkerHandle` sends each call to its actor (``execute`` returns a future) and
handles the messages the drain thread (``drain.py``) reads from it, in order: call returns
resolve their futures, output lines are printed with the rank prefix (and written to the rank's
log file), everything else goes to the events queue. ``confirmed`` counts the messages handled:
the next drain tells the actor, which keeps each message until then. Once the actor is gone
(``on_death``) its pending calls fail and ``Exited(-9, cause=why)`` is queued.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import cloudpickle
import ray

from phalanx._internal.engines.base import WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import (
    Closed,
    Events,
    Exited,
    Output,
    Poll,
    Preempting,
    Report,
    Return,
    UnknownMessage,
    decode,
)
from phalanx._internal.engines.pending_calls import PendingCalls
from phalanx._internal.engines.rank_output import RankOutput
from phalanx._internal.worker.runtime import RemoteCallError, undecodable_error

logger = logging.getLogger(__name__)
T = TypeVar("T")


class RayWorkerDied(ConnectionError):
    """The Ray actor of a worker is gone: its process died, it was killed, or its node was lost."""


class RayWorkerHandle(WorkerHandle):
    def __init__(
        self, index: int, actor: Any, events: Events, log_dir: str | None, attempt: int
    ) -> None:
        self.index = index
        self.rank = index
        self.actor = actor
        self.metadata = WorkerMetadata(host="", node_id="", pid=None)
        self.returncode: int | None = None  # Ray does not tell exit codes; see ``death``
        self.death: str | None = None
        self.closed = threading.Event()  # set when the last message arrived, or the actor died
        self._events = events
        self._calls = PendingCalls()
        self._lock = threading.Lock()
        self._output = RankOutput(self, log_dir, attempt)
        self._stopping = False
        self.broken: RemoteCallError | None = None  # set once a message could not be read
        self.confirmed = 0  # messages of this actor handled (numbered from 0), told each drain
        # Lost with its node (unreachable, or the GCS says the node is dead), not a process
        # that died alone: the next placement keeps off that node (RayEngine._lost_nodes).
        self.node_lost = False
        self.placement: tuple[Any, int] | None = None  # (placement group, bundle index)

    # -- WorkerHandle ---------------------------------------------------------------------------

    def execute(self, fn: Callable[..., T], *args: object, **kwargs: object) -> Future[T]:
        future: Future[T] = Future()
        payload = cloudpickle.dumps((fn, args, kwargs))
        with self._lock:
            if self.death is not None or self.broken is not None:
                future.set_exception(self.broken or RayWorkerDied(str(self.death)))
                return future
            self.actor.call.remote(self._calls.add(future), payload)
        return future

    def kill(self, force: bool = True) -> None:
        self._stopping = True
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            logger.debug("ray.kill of worker %d failed", self.index, exc_info=True)

    def is_alive(self) -> bool:
        return self.death is None

    def set_rank(self, rank: int) -> None:
        self.rank = rank

    def rebind(
        self, events: Events, log_dir: str | None, attempt: int, index: int | None = None
    ) -> None:
        """Serve the next attempt (in-place recovery): the same actor, its calls and messages
        numbered on; its events and output go to the new attempt's queue and log. ``index``:
        its worker index in the new group (an elastic group renumbers its survivors)."""
        with self._lock:
            self._output.close()
            self._events = events
            if index is not None:
                self.index = index
            self._output = RankOutput(self, log_dir, attempt)
            self.rank = self.index
            self.closed.clear()

    @property
    def stopping(self) -> bool:
        """The driver killed this actor: its death is expected."""
        return self._stopping

    # -- called by the poller thread ------------------------------------------------------------

    def on_answer(self, base: int, batch: list[bytes]) -> None:
        """A drain's answer: messages numbered from ``base``; those handled already are skipped."""
        fresh = batch[max(0, self.confirmed - base) :]
        self.on_messages(fresh)
        # Counted once handled: in-place recovery rebinds this handle to the next attempt once
        # every message of the old one is counted, so none of them reaches the new attempt.
        self.confirmed = max(self.confirmed, base + len(batch))

    def on_messages(self, batch: list[bytes]) -> None:
        for data in batch:
            try:
                wire = pickle.loads(data)
            except Exception as exc:
                self.fail(undecodable_error(self.rank, data, exc))
                continue
            match decode(wire):
                case Return() as ret:
                    self._calls.resolve(ret)
                case Output(stream=stream, text=text):
                    self._output.write(text, stream)
                case Closed():
                    self.closed.set()
                case Report() | Preempting() | Poll() as event:
                    self._events.put((self.index, event))
                case other:
                    raise UnknownMessage(f"a Ray actor does not send {type(other).__name__}")

    def fail(self, error: RemoteCallError) -> None:
        """Fail every call in flight (and every later one): the driver cannot follow this worker
        any more, and a lost report or return value must not leave fit() waiting forever."""
        with self._lock:
            self.broken = error
        self._calls.fail_all(error)

    def on_death(self, why: str) -> None:
        """The actor is gone: fail what is pending, then tell the controller."""
        with self._lock:
            if self.death is not None:
                return
            self.death = why
        self._calls.fail_all(RayWorkerDied(why))
        self.closed.set()
        self._output.close()
        if not self._stopping:
            self._events.put((self.index, Exited(-9, cause=why)))

    def finish(self) -> None:
        """The worker is stopped: close its log file."""
        self._output.close()
