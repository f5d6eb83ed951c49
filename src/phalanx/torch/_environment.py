"""What each torch worker's environment should be: pure functions, decided on the driver.

Everything here is plain data in, plain data out, so the rules (torchrun's variables, the CPU
share per worker, which GPUs a worker sees, which interface a rank's collectives bind to) are
tested without processes or GPUs; the few readers of this host's state (its interfaces, its
route to an address) are passed in where a rule needs them.
:mod:`phalanx.torch._worker_setup` applies the results inside the workers. Which of its GPUs is
a worker's device is :mod:`phalanx._devices`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "INTERFACE_VARIABLES",
    "LOOPBACK_ADDRESS",
    "NetworkChoice",
    "collective_interface",
    "cpu_share",
    "interface_addresses",
    "loopback_interface",
    "master_address",
    "shared_visible_devices",
    "torchrun_env",
]

LOOPBACK_ADDRESS = "127.0.0.1"
_IFF_LOOPBACK = 0x8


def torchrun_env(
    *,
    world_rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
) -> dict[str, str]:
    """The variables torchrun gives each worker (``MASTER_*`` are added once the port is known).

    ``NODE_RANK`` is Ray Train's name for torchrun's ``GROUP_RANK``; both are set.
    """
    return {
        "RANK": str(world_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "NODE_RANK": str(node_rank),
    }


def cpu_share(
    resources_per_worker: Mapping[str, float] | None, cpu_count: int, local_world_size: int
) -> int:
    """Threads a worker should use: its ``CPU`` resource if given, else an equal share of the
    node's cores (never below 1). Without this, every worker starts one thread per core and
    ``local_world_size`` workers fight over the same cores."""
    cpus = (resources_per_worker or {}).get("CPU")
    if cpus:
        return max(1, int(cpus))
    return max(1, cpu_count // max(1, local_world_size))


def master_address(node_ids: Sequence[str], rank0_host: str) -> str:
    """Where rank 0's store listens: loopback when every worker is on one node (nothing is
    exposed to the network), else rank 0's host."""
    return LOOPBACK_ADDRESS if len(set(node_ids)) <= 1 else rank0_host


def shared_visible_devices(node_ids: Sequence[str], gpu_ids: Sequence[Sequence[int]]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each worker: the union of the GPU ids of every worker on its
    node, sorted (NCCL needs peers on the node visible for peer-to-peer transfers).

    >>> shared_visible_devices(["a", "a", "b"], [(0, 1), (2, 3), (0, 1)])
    ['0,1,2,3', '0,1,2,3', '0,1']
    """
    per_node: dict[str, set[int]] = {}
    for node, ids in zip(node_ids, gpu_ids, strict=True):
        per_node.setdefault(node, set()).update(ids)
    return [",".join(str(i) for i in sorted(per_node[node])) for node in node_ids]


def gpus_shared_by_ranks(
    node_ids: Sequence[str], gpu_ids: Sequence[Sequence[int]]
) -> dict[tuple[str, int], list[int]]:
    """Each GPU that more than one rank was given, as ``(node, gpu id) -> ranks``. NCCL refuses
    two ranks on one device ("Duplicate GPU detected"), deep inside the first collective.

    >>> gpus_shared_by_ranks(["a", "a", "b"], [(0,), (0,), (0,)])
    {('a', 0): [0, 1]}
    """
    owners: dict[tuple[str, int], list[int]] = {}
    for rank, (node, ids) in enumerate(zip(node_ids, gpu_ids, strict=True)):
        for gpu in ids:
            owners.setdefault((node, gpu), []).append(rank)
    return {key: ranks for key, ranks in owners.items() if len(ranks) > 1}


def loopback_interface(sys_class_net: str = "/sys/class/net") -> str:
    """The name of the loopback network interface (``lo`` on Linux), for ``GLOO_SOCKET_IFNAME``."""
    try:
        names = sorted(os.listdir(sys_class_net))
    except OSError:
        return "lo"
    for name in names:
        try:
            with open(os.path.join(sys_class_net, name, "flags")) as f:
                if int(f.read().strip(), 16) & _IFF_LOOPBACK:
                    return name
        except (OSError, ValueError):
            continue
    return "lo"


# The socket interface of each collective library (set where the user did not set them).
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class NetworkChoice:
    """The interface a rank's collectives bind to, and why: ``how`` is ``"node address"`` (the
    interface holding the address the engine reports for the rank's node) or ``"route"`` (the
    interface this host's routing table sends the master's address through)."""

    interface: str
    address: str
    how: str

    def describe(self) -> str:
        reason = (
            "the address Ray reports for this node"
            if self.how == "node address"
            else "the route to the master"
        )
        return f"{self.interface} ({self.address}, {reason})"


def collective_interface(
    node_address: str,
    master: str,
    interfaces: Mapping[str, Sequence[str]] | None = None,
    route: Callable[[str], str | None] | None = None,
) -> NetworkChoice | None:
    """The interface whose address other hosts reach this rank at: the one holding
    ``node_address`` (the engine's address for this node), else the one that routes to
    ``master``; None when neither is found (the libraries' own choice then stands).

    A loopback interface is never chosen for a rank of a group that spans hosts: the host name
    resolving to 127.0.x.x (common in containers) is what makes gloo pick it by itself.

    >>> addrs = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"], "eth1": ["192.168.1.5"]}
    >>> collective_interface("10.0.0.5", "10.0.0.2", addrs, lambda _: None).interface
    'eth0'
    >>> collective_interface("172.16.0.9", "192.168.1.2", addrs, lambda _: "192.168.1.5")
    NetworkChoice(interface='eth1', address='192.168.1.5', how='route')
    """
    if interfaces is None:
        interfaces = interface_addresses()
    found = _interface_of(node_address, interfaces)
    if found is not None:
        return NetworkChoice(found, node_address, "node address")
    source = (route or route_source_address)(master)
    found = _interface_of(source, interfaces) if source else None
    if found is not None and source is not None:
        return NetworkChoice(found, source, "route")
    return None


def _interface_of(address: str, interfaces: Mapping[str, Sequence[str]]) -> str | None:
    try:
        wanted = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if wanted.is_loopback:
        return None
    for name, addresses in interfaces.items():
        for held in addresses:
            try:
                if ipaddress.ip_address(held.split("%", 1)[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def route_source_address(peer: str) -> str | None:
    """The local address this host sends packets to ``peer`` from (no packet is sent: a UDP
    socket's connect only asks the routing table)."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((peer, 9))
            return str(sock.getsockname()[0])
    except OSError:
        return None


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("next", ctypes.POINTER(_IfAddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.POINTER(_SockAddr)),
    ("netmask", ctypes.c_void_p),
    ("ifu", ctypes.c_void_p),
    ("data", ctypes.c_void_p),
]


def interface_addresses() -> dict[str, list[str]]:
    """This host's interfaces and their IPv4/IPv6 addresses (``getifaddrs``); {} where the C
    library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        head = ctypes.POINTER(_IfAddrs)()
        if libc.getifaddrs(ctypes.byref(head)) != 0:
            return {}
    except (OSError, AttributeError):
        return {}
    found: dict[str, list[str]] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.addr and item.name:
                address = _address_text(item.addr.contents)
                if address is not None:
                    found.setdefault(item.name.decode(), []).append(address)
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def _address_text(sockaddr: _SockAddr) -> str | None:
    raw = bytes(sockaddr.data)
    if sockaddr.family == socket.AF_INET:  # port (2 bytes), then the address
        return socket.inet_ntop(socket.AF_INET, raw[2:6])
    if sockaddr.family == socket.AF_INET6:  # port, flow info (4 bytes), then the address
        return socket.inet_ntop(socket.AF_INET6, raw[6:22])
    return None
