"""The driver's thread that drains every Ray actor's messages, and decides when one is lost.

Each actor always has one ``drain`` call in flight. The poller thread waits on all of them with
``ray.wait``; each answer is a batch of messages, handed in order to the actor's
:class:`~phalanx._internal.engines.ray.handle.RayWorkerHandle`. Then the next ``drain`` is sent,
saying how many messages the driver has handled: the actor keeps each message until then (an
answer lost on the way is sent again; one that comes twice is handled once), and a rank's
``report()`` returns only once its report is handled. A ``drain`` that fails means the actor is
dead: the handle fails its pending calls and queues ``Exited(-9, cause=why)``, and
``describe_death`` says why, naming the node.

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
import re
import threading
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from phalanx._foundation import env
from phalanx._internal.engines.rank_output import reader_error
from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.handle import RayWorkerHandle
from phalanx._internal.engines.ray.liveness import HostLiveness, HostSilence, driver_address
from phalanx._internal.engines.ray.probe import RayletProbe

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


class NodeDown(ConnectionError):
    """The raylet of a worker's node refused a connection after accepting one (probe.py)."""

    def __init__(self, node: str) -> None:
        super().__init__(f"its raylet stopped accepting connections (node {node} is down)")


def describe_death(
    handle: RayWorkerHandle, exc: BaseException, node_dead: bool | None = None
) -> str:
    """Why the worker is gone, naming its node (``node_dead``: the caller asked the GCS)."""
    node = handle.metadata.node_id or "?"
    where = f"on node {node} ({handle.metadata.host or '?'})"
    cause = _ray_cause(exc)
    detail = f": {cause}" if cause else ""
    if node_dead is None:
        node_dead = gcs.node_is_dead(node)
    who = f"the Ray actor of rank {handle.rank} (pid {handle.metadata.pid})"
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
            node_dead = not handle.stopping and gcs.node_is_dead(
                node
            )  # a kill of ours: ask nothing
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
        handle.on_death(describe_death(handle, exc, node_dead))
        for mate in mates:
            why = self._unavailable.get(mate, (0.0, exc))[1]  # its own error: it did not die
            self._forget(mate)
            mate.node_lost = handle.node_lost
            mate.on_death(describe_death(mate, why, node_dead))

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
