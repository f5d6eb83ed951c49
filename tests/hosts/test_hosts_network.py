"""The namespace hosts (tests/_helpers/hosts.py): each host its own address on one bridge, a cut
link silences a host without closing its sockets, and everything made is removed after."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phalanx.torch._environment import collective_interface, interface_addresses
from tests._helpers.hosts import Cluster, Hosts, namespaces_unavailable
from tests._helpers.waiting import wait_until

pytestmark = pytest.mark.slow

_unavailable = namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(_unavailable is not None, reason=_unavailable or "")

CONNECT = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(float(sys.argv[3]))\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print('connected')\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
)
LISTEN = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8); print('ready', flush=True)\n"
    "while True:\n"
    "    s.accept()\n"
)


@needs_namespaces
def test_hosts_reach_each_other_until_cut(cluster: Cluster) -> None:
    hosts = cluster.hosts
    a = hosts[0]
    server = hosts.popen(
        0, [sys.executable, "-c", LISTEN, a.address, "29511"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    assert server.pid in hosts.pids(0)
    reach = [sys.executable, "-c", CONNECT, a.address, "29511", "0.5"]
    assert hosts.run(1, reach).strip() == "connected"
    hosts.cut(1)  # no RST, no FIN: the connect just gets no answer
    assert hosts.run(1, reach).strip() in {"TimeoutError", "timeout"}
    hosts.heal(1)
    assert hosts.run(1, reach).strip() == "connected"
    server.stdout.close()
    # (the interface a torch rank on a host binds its collectives to, its eth0: test_host_cut.py)


@needs_namespaces
def test_hosts_are_removed_after() -> None:
    """Hosts of a prefix of their own (the package's cluster holds the default one's lock)."""
    with Hosts(1, prefix="phxrm", subnet="10.213.42") as hosts:
        sleeper = hosts.popen(0, [sys.executable, "-c", "import time; time.sleep(60)"])
        # (ip(8) enters the namespace after it started: not at once)
        wait_until(lambda: sleeper.pid in hosts.pids(0), 30, "the process on the host")
        netns = hosts[0].netns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netns not in listed
    assert sleeper.poll() is not None


def test_interface_choice_never_loopback_and_prefers_the_nodes_address() -> None:
    interfaces = {"lo": ["127.0.0.1"], "eth0": ["10.213.41.11"], "eth1": ["192.168.0.5"]}
    choice = collective_interface("10.213.41.11", "10.213.41.10", interfaces, lambda _: None)
    assert choice is not None and choice.interface == "eth0"
    by_route = collective_interface("127.0.1.1", "192.168.0.1", interfaces, lambda _: "192.168.0.5")
    assert by_route is not None and by_route.interface == "eth1"
    assert (
        collective_interface("127.0.1.1", "10.0.0.1", {"lo": ["127.0.0.1"]}, lambda _: None) is None
    )
    assert "lo" in interface_addresses()
