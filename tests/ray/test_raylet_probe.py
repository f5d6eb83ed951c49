"""The raylet probe on real sockets (no Ray needed): a node is declared down when its raylet's
port refuses a connection after having accepted one, and never otherwise: a port that never
accepted (a firewall's reset, an address the driver cannot reach) and a node that stops
answering without refusing are left to the poller's unavailability bound."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from phalanx._internal.engines.ray import probe as probe_module
from phalanx._internal.engines.ray.probe import PROBE_S, RayletProbe


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def closed_port() -> int:
    """A port nothing listens on (taken from the system, then let go)."""
    with listener() as sock:
        return int(sock.getsockname()[1])


@pytest.fixture
def probes() -> Iterator[list[RayletProbe]]:
    made: list[RayletProbe] = []
    yield made
    for p in made:
        p.stop()


def wait_for_down(p: RayletProbe, seconds: float) -> set[str]:
    deadline = time.monotonic() + seconds
    down: set[str] = set()
    while time.monotonic() < deadline:
        down |= p.take_down()
        if down:
            return down
        time.sleep(0.01)
    return down


def test_a_raylet_that_stops_listening_is_found_down_within_a_few_probe_periods(probes):
    alive, doomed = listener(), listener()
    addresses = {
        name: ("127.0.0.1", s.getsockname()[1]) for name, s in [("a", alive), ("b", doomed)]
    }
    p = RayletProbe(lambda: {"a", "b"}, lambda: addresses)
    probes.append(p)
    time.sleep(3 * PROBE_S)  # both accepted at least once
    assert p.take_down() == set()
    closed_at = time.monotonic()
    doomed.close()
    assert wait_for_down(p, 5.0) == {"b"}
    took = time.monotonic() - closed_at
    assert took < 3 * PROBE_S + 0.5, took  # within a few probe periods, not Ray's ~2.4 s
    time.sleep(3 * PROBE_S)
    assert p.take_down() == set()  # each node once; the live one never
    alive.close()


def test_a_port_that_never_accepted_is_never_declared_down(probes):
    """A refusal from the start says the address is wrong or blocked, not that the node died."""
    p = RayletProbe(lambda: {"x"}, lambda: {"x": ("127.0.0.1", closed_port())})
    probes.append(p)
    assert wait_for_down(p, 10 * PROBE_S) == set()


def test_a_node_that_stops_answering_without_refusing_is_left_to_the_bound(probes, monkeypatch):
    """A vanished machine answers nothing: a connect that times out proves nothing."""
    sock = listener()
    p = RayletProbe(lambda: {"m"}, lambda: {"m": ("127.0.0.1", sock.getsockname()[1])})
    probes.append(p)
    time.sleep(3 * PROBE_S)

    def silent(address: tuple[str, int], timeout: float) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(probe_module.socket, "create_connection", silent)
    assert wait_for_down(p, 10 * PROBE_S) == set()
    sock.close()


def test_nodes_no_longer_watched_are_not_probed(probes):
    """A node whose workers are all gone is not the probe's business any more."""
    watched = {"a"}
    sock = listener()
    p = RayletProbe(lambda: set(watched), lambda: {"a": ("127.0.0.1", sock.getsockname()[1])})
    probes.append(p)
    time.sleep(3 * PROBE_S)
    watched.clear()
    time.sleep(2 * PROBE_S)  # a round in flight finishes
    sock.close()
    assert wait_for_down(p, 10 * PROBE_S) == set()
