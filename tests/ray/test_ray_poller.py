"""The Ray engine's message poller when actors cannot be reached, on a real local Ray.

A really unreachable actor needs a lost node (``test_ray_node_loss.py``: ~40 s, two actors).
Here stand-in actors answer their ``drain`` call as Ray answers for an actor it cannot reach
(``ActorUnavailableError``, which Ray raises to the caller as such), cheaply and by the dozen, so
each rule of the poller is checked on its own: a retry is scheduled, never slept for (the other
actors' messages keep flowing); the bound holds in time, even while a retry is still in flight;
the actors of the node that were unreachable too are lost with the first, and no others.
"""

from __future__ import annotations

import pickle
import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray")

from phalanx._internal.engines.base import WorkerMetadata
from phalanx._internal.engines.messages import Exited, Poll
from phalanx._internal.engines.ray.drain import UNAVAILABLE_S, DrainPoller
from phalanx._internal.engines.ray.handle import RayWorkerHandle

pytestmark = pytest.mark.slow
RETRY_ANSWER_S = 10.0  # how long a stand-in's retried drain hangs before it answers


def stand_in_class(ray: Any) -> Any:
    from ray.exceptions import ActorUnavailableError

    @ray.remote(num_cpus=0, max_concurrency=4)
    class StandIn:
        """``drain`` answers one ``poll`` message every ``every_s`` (``ok``), or
        ActorUnavailableError after ``every_s`` (``unavailable``), or once and then only after
        ``hang_s`` (``once``: a retry in flight to an actor on a killed node, which takes ~2 s to
        fail)."""

        def __init__(self, mode: str, every_s: float, hang_s: float = 0.0) -> None:
            self.mode, self.every_s, self.hang_s, self.answered = mode, every_s, hang_s, 0

        def set_mode(self, mode: str) -> None:
            self.mode = mode

        def drain(self, wait_s: float, confirmed: int) -> tuple[int, list[bytes]]:
            time.sleep(self.hang_s if self.mode == "once" and self.answered else self.every_s)
            self.answered += 1
            if self.mode == "ok":  # a new message each time: numbered after what was confirmed
                return confirmed, [pickle.dumps(("poll",))]
            raise ActorUnavailableError("stand-in: the node cannot be reached", None)

    return StandIn


class Poller:
    """A real DrainPoller following stand-in actors; events time-stamped as they arrive."""

    def __init__(self, ray: Any) -> None:
        self.ray, self.cls = ray, stand_in_class(ray)
        self.events: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.handles: list[RayWorkerHandle] = []
        self.poller = DrainPoller()

    def actor(self, mode: str, every_s: float, hang_s: float = 0.0) -> Any:
        """A started stand-in actor (not followed yet)."""
        return self.actors(1, mode, every_s, hang_s)[0]

    def actors(self, n: int, mode: str, every_s: float, hang_s: float = 0.0) -> list[Any]:
        """``n`` stand-in actors, started together."""
        actors = [self.cls.remote(mode, every_s, hang_s) for _ in range(n)]
        self.ray.get([actor.__ray_ready__.remote() for actor in actors])
        return actors

    def follow(self, actor: Any, node: str) -> RayWorkerHandle:
        handle = RayWorkerHandle(len(self.handles), actor, self.events, None, 0)  # type: ignore[arg-type]
        handle.metadata = WorkerMetadata(host="127.0.0.1", node_id=node, pid=None)
        self.handles.append(handle)
        self.poller.add(handle)
        return handle

    def add(self, node: str, mode: str, every_s: float, hang_s: float = 0.0) -> RayWorkerHandle:
        return self.follow(self.actor(mode, every_s, hang_s), node)

    def collect(self, seconds: float, exits: int | None = None) -> list[tuple[float, int, Any]]:
        """The events of ``seconds``, or until ``exits`` workers were lost."""
        got: list[tuple[float, int, Any]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                index, event = self.events.get(timeout=left)
            except queue.Empty:
                break
            got.append((time.monotonic(), index, event))
            if exits is not None and sum(isinstance(e, Exited) for _, _, e in got) >= exits:
                break
        return got

    def close(self) -> None:
        self.poller.stop()
        for handle in self.handles:
            handle.kill()
            handle.finish()


@pytest.fixture
def poller(local_ray: Any) -> Iterator[Poller]:
    p = Poller(local_ray)
    try:
        yield p
    finally:
        p.close()


def rate(events: list[tuple[float, int, Any]], index: int, since: float) -> float:
    """Messages of worker ``index`` per second, from ``since`` to the last event."""
    times = [t for t, i, event in events if i == index and event == Poll() and t > since]
    return len(times) / max(events[-1][0] - since, 1e-9) if times else 0.0


def test_unreachable_actors_do_not_hold_up_the_messages_of_the_others(poller):
    healthy = poller.follow(poller.actor("ok", every_s=0.02), "node-a")
    started = time.monotonic() + 0.2  # its first answer came
    alone = rate(poller.collect(1.5), healthy.index, started)  # the control
    assert alone > 0
    # a lost node's ranks, each answering unavailable 5 times a second
    unreachable = poller.actors(6, "unavailable", every_s=0.2)
    for actor in unreachable:
        poller.follow(actor, "node-b")
    failing = time.monotonic() + 0.3  # their first answers came
    events = poller.collect(2.0)  # before their UNAVAILABLE_S bound: they are all retried
    beside = rate(events, healthy.index, failing)
    # Compared with the same actor alone on this machine, now: sleeping POLL_S per unavailable
    # answer (30 a second here) let through about a tenth of its messages.
    assert beside >= alone / 2, f"{beside:.0f} messages/s beside them, {alone:.0f} alone"


def test_an_unreachable_actor_is_lost_at_the_bound_while_its_retry_is_in_flight(poller):
    actor = poller.actor("once", every_s=0.05, hang_s=RETRY_ANSWER_S)
    added = time.monotonic()
    lost = poller.follow(actor, "node-a")
    (at, index, _), *_ = [e for e in poller.collect(6.0, 1) if isinstance(e[2], Exited)]
    assert index == lost.index
    took = at - added
    # The first answer ~0.05 s after; lost at the bound, checked every pass (POLL_S), before
    # the retry's answer comes (RETRY_ANSWER_S after the first).
    assert UNAVAILABLE_S <= took < RETRY_ANSWER_S, took
    assert "node-a" in lost.death and f"unreachable for {UNAVAILABLE_S:g} s" in lost.death


def test_the_unreachable_actors_of_a_node_are_lost_together_and_no_others(poller):
    actors = poller.actors(4, "ok", every_s=0.05)
    first, mate, answering, elsewhere = (
        poller.follow(actor, node)
        for actor, node in zip(actors, ["node-a", "node-a", "node-a", "node-b"], strict=True)
    )  # ``answering``: of the same node, it still answers (a rank that died alone)
    poller.ray.get(first.actor.set_mode.remote("once"))
    # The behaviour under test: node-a's second actor and node-b's stop answering later than the
    # first, by half the bound (a sleep on purpose: two failures apart in time).
    time.sleep(UNAVAILABLE_S / 2)
    later = time.monotonic()  # before they can fail: their bounds count from after this
    poller.ray.get([mate.actor.set_mode.remote("once"), elsewhere.actor.set_mode.remote("once")])
    events = poller.collect(3 * UNAVAILABLE_S, exits=3)
    exits = [(at, index) for at, index, event in events if isinstance(event, Exited)]
    when = {index: at for at, index in exits}
    assert set(when) == {first.index, mate.index, elsewhere.index}, exits
    assert when[mate.index] < later + UNAVAILABLE_S  # with the first, before its own bound
    assert when[elsewhere.index] >= later + UNAVAILABLE_S  # its own bound: another node
    assert [index for _, index in exits][-1] == elsewhere.index
    assert answering.is_alive()
    assert "node-a" in mate.death and "unreachable" in mate.death


def test_the_driver_handles_a_message_sent_twice_once():
    """An answer that comes again (its first copy was lost on the way, the actor sent it again
    with a new message) is handled from where the driver left off."""
    events: queue.Queue = queue.Queue()
    handle = RayWorkerHandle(0, None, events, None, 0)  # type: ignore[arg-type]
    poll = pickle.dumps(("poll",))
    handle.on_answer(0, [poll, poll])
    handle.on_answer(0, [poll, poll, poll])  # the first two again (their answer was lost), one new
    assert handle.confirmed == 3
    got = []
    while not events.empty():
        got.append(events.get_nowait())
    assert got == [(0, Poll())] * 3
