"""The driver side of one Ray actor, and the thread that drains every actor's messages.

Each actor always has one ``drain`` call in flight. The poller thread waits on all of them with
``ray.wait``; each answer is a batch of messages, handled in order: call returns resolve their
futures, output lines are printed with the rank prefix (and written to the rank's log file),
everything else goes to the events queue. Then the next ``drain`` is sent. A ``drain`` that fails
means the actor is dead: its pending calls fail and ``Exited(-9, cause=why)`` is queued.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle
import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from phalanx._internal.engines.base import WorkerHandle, WorkerMetadata
from phalanx._internal.engines.calls import PendingCalls
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
from phalanx._internal.engines.rank_output import RankOutput, reader_error
from phalanx._internal.engines.ray import gcs
from phalanx._internal.worker.runtime import RemoteCallError, undecodable_error

logger = logging.getLogger(__name__)

DRAIN_WAIT_S = 1.0  # how long an idle actor holds a drain call before answering "nothing"
POLL_S = 0.05  # how often the poller looks for newly added actors
# ActorUnavailableError is transient: retry for this long after the first, then the worker is
# lost. A bound in time, not in tries: a call to an actor on a killed node takes ~2 s to fail,
# so 50 tries waited for the GCS to declare the node dead (~15 s with Ray's health checks).
UNAVAILABLE_S = 2.5


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

    # -- WorkerHandle ---------------------------------------------------------------------------

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
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

    # -- called by the poller thread ------------------------------------------------------------

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

    def describe_death(self, exc: BaseException) -> str:
        node = self.metadata.node_id or "?"
        where = f"on node {node} ({self.metadata.host or '?'})"
        cause = _ray_cause(exc)
        detail = f": {cause}" if cause else ""
        if _node_is_dead(node):
            return (
                f"the Ray actor of rank {self.rank} (pid {self.metadata.pid}) was lost {where}: "
                f"the node left the cluster{detail}"
            )
        return f"the Ray actor of rank {self.rank} (pid {self.metadata.pid}) died {where}{detail}"


def _ray_cause(exc: BaseException) -> str:
    """The line of Ray's error that says why the actor died, without Ray's generic advice."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    reason = next((ln for ln in lines if ln.startswith("The actor is dead because")), None)
    if reason is None:
        return lines[0] if lines else ""
    return reason.split(" Some common causes")[0][:400]


def _node_is_dead(node_id: str) -> bool:
    try:
        return any(n["NodeID"] == node_id and not n["Alive"] for n in gcs.nodes())
    except Exception:
        return False


class DrainPoller:
    """One driver thread that keeps a ``drain`` call in flight per actor and routes the answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[Any, RayWorkerHandle] = {}
        self._unavailable: dict[RayWorkerHandle, float] = {}  # -> first unavailable answer
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="phalanx-ray-poller", daemon=True)
        self._thread.start()

    def add(self, handle: RayWorkerHandle) -> None:
        self._submit(handle)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        with self._lock:
            self._inflight.clear()

    def _submit(self, handle: RayWorkerHandle) -> None:
        ref = handle.actor.drain.remote(DRAIN_WAIT_S)
        with self._lock:
            self._inflight[ref] = handle

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._poll_once()
            except BaseException as exc:  # Ray itself went away (ray.shutdown() while fit() ran)
                if self._stopping.is_set():
                    return
                if not ray.is_initialized():
                    self._fail_all(f"Ray shut down while fit() ran ({exc!r})")
                    return
                logger.exception("The Ray engine's message poller failed; retrying")
                self._stopping.wait(POLL_S)

    def _fail_all(self, why: str) -> None:
        """Nothing reads the actors' messages any more: every worker is lost to the driver."""
        with self._lock:
            handles, self._inflight = list(self._inflight.values()), {}
        for handle in handles:
            handle.on_death(why)

    def _poll_once(self) -> None:
        with self._lock:
            refs = list(self._inflight)
        if not refs:
            self._stopping.wait(POLL_S)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
        if not ready:
            return
        if len(refs) > 1:  # answer every actor that is ready, not only the first
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            with self._lock:
                handle = self._inflight.pop(ref)
            self._answer(handle, ref)

    def _answer(self, handle: RayWorkerHandle, ref: Any) -> None:
        try:
            batch = ray.get(ref)
        except ActorUnavailableError as exc:  # transient (network, or death not yet confirmed)
            since = self._unavailable.setdefault(handle, time.monotonic())
            if time.monotonic() - since < UNAVAILABLE_S:
                self._stopping.wait(POLL_S)
                self._submit(handle)
            else:
                handle.on_death(handle.describe_death(exc))
            return
        except RayActorError as exc:
            handle.on_death(handle.describe_death(exc))
            return
        except Exception as exc:  # a message that cannot be read: treat the worker as lost
            logger.exception("Reading worker %d's messages failed", handle.index)
            handle.on_death(f"reading the messages of rank {handle.rank} failed: {exc!r}")
            return
        self._unavailable.pop(handle, None)
        try:
            handle.on_messages(batch)
        except Exception as exc:  # a lost message would leave its call waiting forever
            logger.exception("Handling worker %d's messages failed", handle.index)
            handle.fail(reader_error(handle.rank, exc))
        if not handle.closed.is_set():
            self._submit(handle)
