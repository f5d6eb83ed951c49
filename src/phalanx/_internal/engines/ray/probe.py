"""Notice a node whose raylet is gone within milliseconds.

When a node's raylet dies (the node was shut down, preempted with notice, or its raylet crashed or
was OOM-killed), a call to an actor there fails only after Ray has retried the connection
(seconds later, as ``ActorUnavailableError``), and the GCS declares the node dead after its
health checks (~15 s with Ray's defaults). Yet the raylet's sockets close at once.

:class:`RayletProbe` holds one idle TCP connection to the raylet of every node that hosts a
followed worker (the raylet's gRPC server sends its settings and waits; nothing else is said) and
waits on all of them in a thread of its own, so it costs nothing while the nodes live. When one
closes, it connects again at once: a raylet that **refuses** after having **accepted** is gone,
and the node is reported down; an accepted connection (the server let an idle connection go)
replaces the closed one. A driver that cannot reach the raylets at all (a firewall, Ray Client)
and a machine that vanished without closing anything (no answer at all) are never declared by the
probe: the poller's unavailability bound (``drain.UNAVAILABLE_S``) decides as before.
"""

from __future__ import annotations

import logging
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable

from phalanx._internal.engines.ray import gcs

logger = logging.getLogger(__name__)

WATCH_S = 0.5  # how often the thread looks at which nodes to watch (it wakes at once on a close)
CONNECT_TIMEOUT_S = 0.5  # a connect neither accepted nor refused by then says nothing
RETRY_S = 5.0  # a node whose raylet could not be reached is tried again this much later
ADDRESS_REFRESH_S = 2.0  # ask the GCS for the addresses of new nodes at most this often
MAX_WATCHED = 256  # connections held at most (a quarter of the open-file limit, if lower)


def raylet_addresses() -> dict[str, tuple[str, int]]:
    """The raylet address of each live node, from the GCS (bounded)."""
    import ray

    listed = gcs.bounded(ray.nodes, "ray.nodes()", timeout_s=ADDRESS_REFRESH_S)
    return {
        str(info["NodeID"]): (str(info["NodeManagerAddress"]), int(info["NodeManagerPort"]))
        for info in listed
        if info.get("Alive") and info.get("NodeManagerAddress") and info.get("NodeManagerPort")
    }


def _max_watched() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_WATCHED if soft == resource.RLIM_INFINITY else max(1, min(MAX_WATCHED, soft // 4))


class RayletProbe:
    """Watches the raylets of the nodes ``watched()`` names; ``take_down()`` gives the nodes
    found down since the last call (each once)."""

    def __init__(
        self,
        watched: Callable[[], set[str]],
        lookup: Callable[[], dict[str, tuple[str, int]]] | None = None,
    ) -> None:
        self._watched = watched
        self._lookup = lookup or raylet_addresses
        self._lock = threading.Lock()
        self._down: set[str] = set()  # found down, not yet taken
        self._addresses: dict[str, tuple[str, int]] = {}
        self._asked_at = float("-inf")
        self._open: dict[str, socket.socket] = {}  # node -> its idle connection
        self._reachable: set[str] = set()  # a node whose raylet accepted a connection once
        self._failed_at: dict[str, float] = {}  # node -> when its raylet could not be reached
        self._reported: set[str] = set()
        self._limit = _max_watched()
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="phalanx-ray-probe", daemon=True)
        self._thread.start()

    def take_down(self) -> set[str]:
        with self._lock:
            down, self._down = self._down, set()
        return down

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * WATCH_S + CONNECT_TIMEOUT_S)

    # -- the probe thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._follow(self._wanted())
                    for key, _ in self._selector.select(WATCH_S):
                        self._readable(key.data, key.fileobj)  # type: ignore[arg-type]
                except Exception:  # the probe only ever speeds things up: never fail the run
                    logger.debug("raylet probe round failed", exc_info=True)
                    self._stop.wait(1.0)
        finally:
            for node in list(self._open):
                self._close(node)
            self._selector.close()

    def _wanted(self) -> list[str]:
        nodes = sorted(n for n in self._watched() if n and n != "?" and n not in self._reported)
        return nodes[: self._limit]

    def _follow(self, nodes: list[str]) -> None:
        """Connect to the raylets of new nodes; let go of nodes no longer watched."""
        for node in [n for n in self._open if n not in nodes]:
            self._close(node)
        new = [n for n in nodes if n not in self._open]
        now = time.monotonic()
        new = [n for n in new if now - self._failed_at.get(n, float("-inf")) >= RETRY_S]
        if not new:
            return
        self._learn_addresses(new)
        for node in new:
            if node in self._addresses:
                self._connect(node)

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

    def _connect(self, node: str) -> None:
        """A new idle connection to ``node``'s raylet; a refusal after an acceptance: down."""
        address = self._addresses[node]
        try:
            sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        except ConnectionRefusedError:
            if node in self._reachable:
                logger.debug("raylet of node %s at %s:%d refused a connection", node, *address)
                self._reported.add(node)
                with self._lock:
                    self._down.add(node)
            else:
                self._failed_at[node] = time.monotonic()
            return
        except OSError:  # a timeout, no route: says nothing either way
            self._failed_at[node] = time.monotonic()
            return
        sock.setblocking(False)
        self._reachable.add(node)
        self._open[node] = sock
        self._selector.register(sock, selectors.EVENT_READ, node)

    def _readable(self, node: str, sock: socket.socket) -> None:
        """Data (the server's settings: read and dropped) or a close: then connect again."""
        try:
            while sock.recv(4096):
                pass
        except BlockingIOError:
            return  # still open
        except OSError:  # reset: closed
            pass
        self._close(node)
        self._connect(node)

    def _close(self, node: str) -> None:
        sock = self._open.pop(node, None)
        if sock is not None:
            self._selector.unregister(sock)
            sock.close()
