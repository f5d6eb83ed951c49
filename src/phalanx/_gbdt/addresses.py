"""Where a worker group's own sockets (XGBoost's tracker, LightGBM's ports) listen."""

from __future__ import annotations

import random
import socket

from phalanx.backend import WorkerGroup

__all__ = ["LOOPBACK", "cpus_per_worker", "group_addresses", "reserve_port"]

LOOPBACK = "127.0.0.1"


def group_addresses(worker_group: WorkerGroup) -> list[str]:
    """The address of each rank, in rank order: loopback for everyone when every worker is on
    one node (nothing is exposed to the network), else each worker's node address."""
    workers = worker_group.workers
    if len({w.node_id for w in workers}) <= 1:
        return [LOOPBACK] * len(workers)
    return [w.host for w in workers]


# Below Linux's ephemeral range (32768-60999 by default): the port is released just before the
# library binds it, and a port from the ephemeral range can be taken in that moment as the source
# port of any outgoing connection (another rank's, connecting to its peers), and the library
# then fails with LightGBMError "Binding port N failed".
_PORTS = range(20000, 32768)
_TRIES = 50
_RANDOM = random.SystemRandom()  # never the user's seeded global generator


def reserve_port(host: str) -> socket.socket:
    """A bound, not listening, socket on a free port of ``host``: the port stays taken (the
    kernel hands it to no one else) until the socket is closed, right before it is used. The
    port comes from outside the ephemeral range when one is free there (see ``_PORTS``)."""
    for port in _RANDOM.sample(_PORTS, _TRIES):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def cpus_per_worker(worker_group: WorkerGroup) -> float | None:
    """The ``CPU`` resource the user asked for per worker, or None (then each worker uses an
    equal share of its node's cores)."""
    scaling = worker_group.scaling_config
    return (scaling.resources_per_worker or {}).get("CPU") or None
