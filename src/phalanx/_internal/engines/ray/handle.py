"""The driver side of one Ray actor, and the thread that drains every actor's messages.

Each actor always has one ``drain`` call in flight. The poller thread waits on all of them with
``ray.wait``; each answer is a batch of messages, handled in order: call returns resolve their
futures, output lines are printed with the rank prefix (and written to the rank's log file),
everything else goes to the events queue. Then the next ``drain`` is sent, saying how many
messages the driver has handled: the actor keeps each message until then (an answer lost on the
way is sent again; one that comes twice is handled once), and a rank's ``report()`` returns only
once its report is handled. A ``drain`` that fails means the actor is dead: its pending calls
fail and ``Exited(-9, cause=why)`` is queued.

``ActorUnavailableError`` is the exception: Ray cannot reach the actor but does not know it is
dead (a network blip, or a node that died before the GCS's health checks say so, ~15 s with Ray's
defaults). The worker is lost ``UNAVAILABLE_S`` after the first such answer unless the actor
answers in between: the deadline is checked on every pass, so it holds while a retry is still in
flight, and the retry is scheduled, not slept for, so the other actors' messages keep flowing.
A worker lost so takes with it every worker of its node that has been unavailable since its last
answer (or every worker of the node, if the GCS already says the node is dead): a lost node is
one failure that names all its ranks, not a first rank and a torn-down attempt.

Sooner still: a node whose raylet is gone (shut down, preempted, raylet killed) is found by
:class:`~phalanx._internal.engines.ray.probe.RayletProbe` within milliseconds (its idle connection
closes and the raylet refuses a new one), and all its workers are lost at once (``NodeDown``); a
node that stops answering altogether is left to the bound above.

A host cut off the network (nothing fails, nothing closes) is found by phalanx's own liveness
on the drain answers (``liveness.py``): silent past a bound of at most 3 s, it is lost.
"""

from __future__ import annotations

import logging
import pickle
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle
import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from phalanx._foundation import env
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
from phalanx._internal.engines.rank_output import RankOutput, reader_error
from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.liveness import HostLiveness, HostSilence, driver_address
from phalanx._internal.engines.ray.probe import RayletProbe
from phalanx._internal.worker.runtime import RemoteCallError, undecodable_error

logger = logging.getLogger(__name__)

# How long an idle actor holds a drain call before answering "nothing": also the liveness
# heartbeat of an idle worker (liveness.py: its bound is 2.5-3 s, a blip of 1 s must fit under it)
DRAIN_WAIT_S = 0.5
POLL_S = 0.05  # the longest pass: new actors, due retries and unavailability deadlines
RETRY_S = 0.05  # a drain answered ActorUnavailableError is sent again this much later
# A drain still unanswered this long after DRAIN_WAIT_S: its actor is not answering. Alone that
# proves nothing (a call in flight to a killed node can hang without an error); on the node of a
# worker just lost, it is that node's loss too.
OVERDUE_S = 1.5
# ActorUnavailableError is transient: the worker is lost this long after the first one unless
# the actor answers in between. A bound in time, checked every pass, not in tries nor in answers:
# a call to an actor on a killed node takes about 2 s to fail (Ray retries the connection), so
# waiting for the retry's answer would make a loss take three times that. Ray Train gives up at the first
# ActorUnavailableError its health check (a call every 2 s) gets, so it survives only blips that
# fall between two checks; the drain call is always in flight, so phalanx sees every blip and
# needs to ride out any blip Ray Train can: 2 s, and a retry that connects once it is over.
UNAVAILABLE_S = 2.5
NODE_QUERY_S = 2.0  # the poller asks the GCS whether a node is dead; it must not stall for long


class RayWorkerDied(ConnectionError):
    """The Ray actor of a worker is gone: its process died, it was killed, or its node was lost."""


class NodeDown(ConnectionError):
    """The raylet of a worker's node refused a connection after accepting one (probe.py)."""

    def __init__(self, node: str) -> None:
        super().__init__(f"its raylet stopped accepting connections (node {node} is down)")


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

    def describe_death(self, exc: BaseException, node_dead: bool | None = None) -> str:
        """Why the worker is gone, naming its node (``node_dead``: the caller asked the GCS)."""
        node = self.metadata.node_id or "?"
        where = f"on node {node} ({self.metadata.host or '?'})"
        cause = _ray_cause(exc)
        detail = f": {cause}" if cause else ""
        if node_dead is None:
            node_dead = _node_is_dead(node)
        who = f"the Ray actor of rank {self.rank} (pid {self.metadata.pid})"
        if isinstance(exc, HostSilence):
            return f"{who} was lost {where}: {exc}"
        if node_dead:
            return f"{who} was lost {where}: the node left the cluster{detail}"
        if isinstance(exc, ActorUnavailableError):
            return (
                f"{who} was lost {where}: the node's actors were unreachable for "
                f"{UNAVAILABLE_S:g} s (the node or its network is down){detail}"
            )
        return f"{who} died {where}{detail}"


def _ray_cause(exc: BaseException) -> str:
    """The line of Ray's error that says why the actor died, without Ray's generic advice (nor
    the actor's id: ranks lost together then read the same)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    reason = next((ln for ln in lines if ln.startswith("The actor is dead because")), None)
    if reason is None:
        first = lines[0] if lines else ""
        return _ACTOR_ID.sub("The actor ", first).split(" The task may or")[0][:400]
    return reason.split(" Some common causes")[0][:400]


_ACTOR_ID = re.compile(r"The actor [0-9a-f]{16,} ")


def _node_is_dead(node_id: str) -> bool:
    """Whether the GCS says the node left the cluster; False when it cannot say in time."""
    if not node_id or node_id == "?":
        return False
    try:
        nodes = gcs.bounded(ray.nodes, "ray.nodes()", timeout_s=NODE_QUERY_S)
        return any(n["NodeID"] == node_id and not n["Alive"] for n in nodes)
    except Exception:
        return False


class DrainPoller:
    """One driver thread that keeps a ``drain`` call in flight per actor and routes the answers.

    Only the poller thread touches ``_retry_at`` and ``_unavailable``; ``_inflight`` is shared
    with ``add`` (under the lock).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[Any, RayWorkerHandle] = {}
        self._retry_at: dict[RayWorkerHandle, float] = {}  # -> when to send its drain again
        self._sent_at: dict[RayWorkerHandle, float] = {}  # -> when its drain in flight was sent
        # -> (first ActorUnavailableError since its last answer, the latest one)
        self._unavailable: dict[RayWorkerHandle, tuple[float, BaseException]] = {}
        self._stopping = threading.Event()
        self._probe = RayletProbe(self._watched_nodes)
        self._liveness = HostLiveness(env.host_silent_s(), driver_address())
        self._thread = threading.Thread(target=self._run, name="phalanx-ray-poller", daemon=True)
        self._thread.start()

    def add(self, handle: RayWorkerHandle) -> None:
        self._submit(handle)

    def stop(self) -> None:
        self._stopping.set()
        self._probe.stop()
        self._thread.join(timeout=5)
        with self._lock:
            self._inflight.clear()

    def _submit(self, handle: RayWorkerHandle) -> None:
        ref = handle.actor.drain.remote(DRAIN_WAIT_S, handle.confirmed)
        with self._lock:
            self._inflight[ref] = handle
            self._sent_at[handle] = time.monotonic()

    def _silent(self, handle: RayWorkerHandle, now: float) -> bool:
        """Whether ``handle``'s drain is overdue: a live actor answers within DRAIN_WAIT_S."""
        with self._lock:
            sent = self._sent_at.get(handle)
        return sent is not None and now - sent > DRAIN_WAIT_S + OVERDUE_S

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

    def _followed(self) -> list[RayWorkerHandle]:
        """Every worker the poller follows: a drain in flight, or one due to be sent."""
        with self._lock:
            handles = list(self._inflight.values())
        return list(dict.fromkeys([*handles, *self._retry_at]))

    def _fail_all(self, why: str) -> None:
        """Nothing reads the actors' messages any more: every worker is lost to the driver."""
        handles = self._followed()
        with self._lock:
            self._inflight = {}
        self._retry_at.clear()
        for handle in handles:
            handle.on_death(why)

    def _poll_once(self) -> None:
        self._liveness.tick(time.monotonic(), POLL_S)
        with self._lock:
            refs = list(self._inflight)
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
            if ready and len(refs) > 1:  # answer every actor that is ready, not only the first
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                with self._lock:
                    handle = self._inflight.pop(ref, None)
                if handle is not None:  # None: declared lost while this drain was in flight
                    self._answer(handle, ref)
        else:
            self._stopping.wait(POLL_S)
        self._lose_down_nodes()
        self._enforce_unavailable_bound()
        self._lose_silent_hosts()
        self._send_due_retries()

    def _watched_nodes(self) -> set[str]:
        """The nodes of the workers followed (called by the probe's thread)."""
        with self._lock:
            handles = list(self._inflight.values())
        return {h.metadata.node_id for h in handles if h.death is None and not h.stopping}

    def _lose_down_nodes(self) -> None:
        """Every worker of a node whose raylet the probe found gone is lost, now (one failure
        naming all of them), instead of after Ray's connection retries and UNAVAILABLE_S."""
        for node in self._probe.take_down():
            on_node = [
                h
                for h in dict.fromkeys([*self._followed(), *self._unavailable])
                if h.metadata.node_id == node and h.death is None and not h.stopping
            ]
            if on_node:
                self._lose(on_node[0], NodeDown(node), node_dead=True)

    def _lose_silent_hosts(self) -> None:
        """Every worker of a host silent past the liveness bound is lost (liveness.py): one
        failure per node, naming the host and its ranks."""
        followed = [h for h in self._followed() if h.death is None and not h.stopping]
        for first, why in self._liveness.lost(followed, time.monotonic()):
            if first.death is None:
                self._lose(first, why, node_dead=True)

    def _send_due_retries(self) -> None:
        now = time.monotonic()
        for handle in [h for h, at in self._retry_at.items() if at <= now]:
            del self._retry_at[handle]
            self._submit(handle)

    def _enforce_unavailable_bound(self) -> None:
        """A worker unavailable for UNAVAILABLE_S is lost, whether or not a retry is in flight."""
        now = time.monotonic()
        for handle, (since, _) in list(self._unavailable.items()):
            if handle in self._unavailable and now - since >= UNAVAILABLE_S:
                self._lose(handle, self._unavailable[handle][1])

    def _lose(
        self, handle: RayWorkerHandle, exc: BaseException, node_dead: bool | None = None
    ) -> None:
        """``handle``'s actor is gone, and with it every worker of its node that was also
        unavailable since its last answer or whose drain is overdue (all of them if the node is
        dead: ``node_dead``, else the GCS is asked)."""
        node = handle.metadata.node_id
        if node_dead is None:
            node_dead = not handle.stopping and _node_is_dead(node)  # a kill of ours: ask nothing
        now = time.monotonic()
        mates = [
            h
            for h in dict.fromkeys([*self._followed(), *self._unavailable])
            if h is not handle
            and node
            and h.metadata.node_id == node
            and h.death is None
            and (h in self._unavailable or node_dead or self._silent(h, now))
        ]
        self._forget(handle)
        handle.node_lost = not handle.stopping and (
            node_dead or isinstance(exc, ActorUnavailableError | NodeDown)
        )
        handle.on_death(handle.describe_death(exc, node_dead))
        for mate in mates:
            why = self._unavailable.get(mate, (0.0, exc))[1]  # its own error: it did not die
            self._forget(mate)
            mate.node_lost = handle.node_lost
            mate.on_death(mate.describe_death(why, node_dead))

    def _forget(self, handle: RayWorkerHandle) -> None:
        """Stop following ``handle``: a drain still in flight is dropped when it answers."""
        self._unavailable.pop(handle, None)
        self._retry_at.pop(handle, None)
        self._liveness.forget(handle)
        with self._lock:
            self._sent_at.pop(handle, None)
            for ref in [r for r, h in self._inflight.items() if h is handle]:
                del self._inflight[ref]

    def _answer(self, handle: RayWorkerHandle, ref: Any) -> None:
        try:
            base, batch = ray.get(ref)
        except ActorUnavailableError as exc:  # transient (network, or death not yet confirmed)
            since = self._unavailable.get(handle, (time.monotonic(), exc))[0]
            self._unavailable[handle] = (since, exc)
            self._retry_at[handle] = time.monotonic() + RETRY_S  # the bound is checked per pass
            return
        except RayActorError as exc:
            self._lose(handle, exc)
            return
        except Exception as exc:  # a message that cannot be read: treat the worker as lost
            logger.exception("Reading worker %d's messages failed", handle.index)
            self._forget(handle)
            handle.on_death(f"reading the messages of rank {handle.rank} failed: {exc!r}")
            return
        self._unavailable.pop(handle, None)
        self._liveness.heard(handle, handle.metadata.host, time.monotonic())
        try:
            handle.on_answer(base, batch)
        except Exception as exc:  # a lost message would leave its call waiting forever
            logger.exception("Handling worker %d's messages failed", handle.index)
            handle.fail(reader_error(handle.rank, exc))
        if not handle.closed.is_set():
            self._submit(handle)
