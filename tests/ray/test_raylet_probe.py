"""The raylet probe on real sockets (no Ray needed): it holds an idle connection to each watched
raylet; a node is declared down when that connection closes and the raylet's port then refuses a
connection, and never otherwise: a port that never accepted (a firewall's reset, an address the
driver cannot reach), a server that only lets an idle connection go, and a node that stops
answering without refusing are left to the poller's unavailability bound.

``test_ray_node_loss.py`` checks it against a real raylet killed with its node."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from _helpers import wait_until

from phalanx._internal.engines.ray import probe as probe_module
from phalanx._internal.engines.ray.probe import RayletProbe


class FakeRaylet:
    """A listening server that keeps what it accepts; ``kill()`` closes everything at once, as
    the death of the raylet's process does."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = ("127.0.0.1", int(self.listener.getsockname()[1]))
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.sendall(b"settings")  # as a gRPC server does at once
            self.accepted.append(conn)

    def drop_idle(self) -> None:
        """Let the accepted connections go, and keep listening (an idle timeout)."""
        for conn in self.accepted:
            conn.close()
        self.accepted.clear()

    def kill(self) -> None:
        try:  # wakes the accept() in progress: a close alone leaves it listening
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(5)
        self.drop_idle()


def closed_port() -> int:
    """A port nothing listens on (taken from the system, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def probes() -> Iterator[list[RayletProbe]]:
    made: list[RayletProbe] = []
    yield made
    for p in made:
        p.stop()


def start(probes: list[RayletProbe], nodes: dict[str, tuple[str, int]]) -> RayletProbe:
    p = RayletProbe(lambda: set(nodes), lambda: dict(nodes))
    probes.append(p)
    return p


def down_within(p: RayletProbe, seconds: float) -> set[str]:
    deadline = time.monotonic() + seconds
    down: set[str] = set()
    while time.monotonic() < deadline and not down:
        down |= p.take_down()
        time.sleep(0.005)
    return down


def test_a_raylet_that_dies_is_found_down_at_once_and_only_it(probes):
    alive, doomed = FakeRaylet(), FakeRaylet()
    p = start(probes, {"a": alive.address, "b": doomed.address})
    wait_until(lambda: alive.accepted and doomed.accepted, 10, "the probe never connected")
    killed = time.monotonic()
    doomed.kill()
    assert down_within(p, 5.0) == {"b"}
    took = time.monotonic() - killed
    assert took < 1.0, took  # at once (milliseconds measured), not after Ray's ~2.4 s of retries
    assert down_within(p, 3 * probe_module.WATCH_S) == set()  # each node once; the live one never
    alive.kill()


def test_an_idle_connection_let_go_by_a_live_raylet_is_replaced_not_reported(probes):
    raylet = FakeRaylet()
    p = start(probes, {"a": raylet.address})
    wait_until(lambda: len(raylet.accepted) == 1, 10, "the probe never connected")
    raylet.drop_idle()
    wait_until(lambda: len(raylet.accepted) == 1, 10, "the probe did not connect again")
    assert p.take_down() == set()
    raylet.kill()  # ...and the new connection still watches it
    assert down_within(p, 5.0) == {"a"}


def test_a_port_that_never_accepted_is_never_declared_down(probes):
    """A refusal from the start says the address is wrong or blocked, not that the node died."""
    p = start(probes, {"x": ("127.0.0.1", closed_port())})
    assert down_within(p, 4 * probe_module.WATCH_S) == set()


def test_a_raylet_that_stops_answering_without_refusing_is_left_to_the_bound(probes, monkeypatch):
    """A vanished machine answers nothing: a connect that times out proves nothing."""
    raylet = FakeRaylet()
    p = start(probes, {"m": raylet.address})
    wait_until(lambda: raylet.accepted, 10, "the probe never connected")

    def silent(address: tuple[str, int], timeout: float) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(probe_module.socket, "create_connection", silent)
    raylet.kill()
    assert down_within(p, 4 * probe_module.WATCH_S) == set()


def test_nodes_no_longer_watched_are_let_go(probes):
    """A node whose workers are all gone is not the probe's business any more."""
    raylet = FakeRaylet()
    watched = {"a"}
    p = RayletProbe(lambda: set(watched), lambda: {"a": raylet.address})
    probes.append(p)
    wait_until(lambda: raylet.accepted, 10, "the probe never connected")
    watched.clear()

    def let_go() -> bool:  # the probe closed its connection: the server reads the end of it
        conn = raylet.accepted[0]
        conn.settimeout(0.05)
        try:
            return conn.recv(1) == b""
        except TimeoutError:
            return False

    wait_until(let_go, 10, "the probe kept the connection of a node no longer watched")
    raylet.kill()
    assert down_within(p, 4 * probe_module.WATCH_S) == set()
