"""Notice a node whose raylet is gone within a fraction of a second.

When a node's raylet dies (the node was shut down, preempted with notice, or its raylet crashed or
was OOM-killed), a call to an actor there fails only after Ray has retried the connection (~2.4 s
measured here, as ``ActorUnavailableError``), and the GCS declares the node dead after its health
checks (~15 s with Ray's defaults). Yet the raylet's own port refuses connections at once.

:class:`RayletProbe` connects to the raylet of every node that hosts a followed worker, each in
turn (a plain TCP connect, closed at once; at most ``MAX_PROBES_PER_S``, every node at most every
``PROBE_S``), in a thread of its own so a slow connect never holds the message poller. A node is
declared down only when its raylet **refuses** a connection after having **accepted** one: a
driver that cannot reach the raylets at all (a firewall, Ray Client) or a machine that vanished
(no answer at all, not a refusal) is never declared by the probe, and the poller's
unavailability bound (``handle.UNAVAILABLE_S``) decides as before.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from phalanx._internal.engines.ray import gcs

logger = logging.getLogger(__name__)

PROBE_S = 0.25  # the shortest time between two probes of one node
MAX_PROBES_PER_S = 50.0  # all nodes together: 1,000 nodes are each probed every 20 s
CONNECT_TIMEOUT_S = 0.5  # a connect neither accepted nor refused by then says nothing
ADDRESS_REFRESH_S = 2.0  # ask the GCS for the addresses of new nodes at most this often


def raylet_addresses() -> dict[str, tuple[str, int]]:
    """The raylet address of each live node, from the GCS (bounded)."""
    import ray

    listed = gcs.bounded(ray.nodes, "ray.nodes()", timeout_s=ADDRESS_REFRESH_S)
    return {
        str(info["NodeID"]): (str(info["NodeManagerAddress"]), int(info["NodeManagerPort"]))
        for info in listed
        if info.get("Alive") and info.get("NodeManagerAddress") and info.get("NodeManagerPort")
    }


class RayletProbe:
    """Probes the raylets of the nodes ``watched()`` names; ``take_down()`` gives the nodes found
    down since the last call (each once)."""

    def __init__(
        self,
        watched: Callable[[], set[str]],
        lookup: Callable[[], dict[str, tuple[str, int]]] | None = None,
    ) -> None:
        self._watched = watched
        self._lookup = lookup or raylet_addresses
        self._lock = threading.Lock()
        self._addresses: dict[str, tuple[str, int]] = {}
        self._asked_at = float("-inf")
        self._probed_at: dict[str, float] = {}
        self._reachable: set[str] = set()  # a node whose raylet accepted a connection once
        self._down: set[str] = set()  # found down, not yet taken
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="phalanx-ray-probe", daemon=True)
        self._thread.start()

    def take_down(self) -> set[str]:
        with self._lock:
            down, self._down = self._down, set()
        return down

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * CONNECT_TIMEOUT_S)

    # -- the probe thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except Exception:  # the probe only ever speeds things up: never fail the run
                logger.debug("raylet probe round failed", exc_info=True)
                self._stop.wait(1.0)

    def _round(self) -> None:
        nodes = sorted(n for n in self._watched() if n and n != "?" and n not in self._reported)
        if not nodes:
            self._stop.wait(PROBE_S)
            return
        self._learn_addresses(nodes)
        gap = max(PROBE_S / len(nodes), 1.0 / MAX_PROBES_PER_S)
        for node in nodes:
            if self._stop.is_set():
                return
            address = self._addresses.get(node)
            now = time.monotonic()
            if address is not None and now - self._probed_at.get(node, float("-inf")) >= PROBE_S:
                self._probed_at[node] = now
                self._probe(node, address)
            self._stop.wait(gap)

    def _learn_addresses(self, nodes: list[str]) -> None:
        if all(n in self._addresses for n in nodes):
            return
        if time.monotonic() - self._asked_at < ADDRESS_REFRESH_S:
            return
        self._asked_at = time.monotonic()
        try:
            self._addresses.update(self._lookup())
        except Exception:  # the GCS did not answer in time: ask again later
            return

    def _probe(self, node: str, address: tuple[str, int]) -> None:
        try:
            with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S):
                pass
        except ConnectionRefusedError:
            if node in self._reachable:
                logger.debug("raylet of node %s at %s:%d refused a connection", node, *address)
                self._reported.add(node)
                with self._lock:
                    self._down.add(node)
            return
        except OSError:  # a timeout, no route: says nothing either way
            return
        self._reachable.add(node)
