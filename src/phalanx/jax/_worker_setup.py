"""What the JAX backend runs inside each worker: reserve the coordinator port, join, leave.

Sent to the workers by :class:`~phalanx.jax._backend.JaxBackend`; module-level so that they travel
by reference. Each worker finds its part of the plan by its rank.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from types import ModuleType

import phalanx.session as session
from phalanx._foundation import env

__all__ = ["JaxWorkerSpec", "initialize", "reserve_port", "shutdown"]

logger = logging.getLogger(__name__)

DRIVER_RAN_JAX_MESSAGE = (
    "JAX's backends were already initialized in this worker before jax.distributed could be "
    "set up: the driver ran JAX code (e.g. jax.devices(), a jitted function) before fit(), and "
    "local workers are forked from the driver, so they inherited that state.\n"
    "HINT: run JAX code only inside the training function (import jax at the top is fine), or "
    "after fit() returns."
)

# Rank 0 holds its coordinator port from the moment it picks it until jax's coordinator has
# bound it, so no other process on the node can take it in between.
_reservation: socket.socket | None = None


@dataclass(frozen=True)
class JaxWorkerSpec:
    """One worker's part of the setup, decided on the driver."""

    platform: str
    """``cpu``, ``cuda`` or ``tpu``: used unless the user set ``JAX_PLATFORMS``."""
    coordinator: str
    """``host:port`` of rank 0's coordinator service."""
    num_processes: int
    local_device_ids: tuple[int, ...] | None
    timeout_s: float
    bind_address: str | None = None
    """Rank 0 only: ``host:port`` its coordinator service listens on (not every interface)."""


def reserve_port(address: str) -> int:
    """Bind a port on ``address`` (kept until :func:`initialize`) and return it."""
    global _reservation
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # gRPC (jax's coordinator) binds with SO_REUSEPORT as well, so it can share the port
        # with this reservation; any process without it is refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, 0))
    except OSError:
        sock.close()
        raise
    _release()
    _reservation = sock
    return int(sock.getsockname()[1])


def _release() -> None:
    global _reservation
    if _reservation is not None:
        _reservation.close()
        _reservation = None


def initialize(specs: list[JaxWorkerSpec]) -> int:
    """Join ``jax.distributed`` (called on every rank at once); returns ``jax.process_index()``."""
    import jax
    from jax._src import xla_bridge

    rank = session.get_context().get_world_rank()
    spec = specs[rank]
    try:
        if xla_bridge.backends_are_initialized():
            raise RuntimeError(DRIVER_RAN_JAX_MESSAGE)
        jax.config.update("jax_platforms", _platforms(jax, spec.platform))
        if getattr(jax.config, "jax_cpu_collectives_implementation", None) in (None, "none"):
            # Older JAX releases have no cross-process CPU collectives unless asked for.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=spec.coordinator,
            num_processes=spec.num_processes,
            process_id=rank,
            local_device_ids=list(spec.local_device_ids) if spec.local_device_ids else None,
            initialization_timeout=max(1, int(spec.timeout_s)),
            shutdown_timeout_seconds=SHUTDOWN_BARRIER_S,
            coordinator_bind_address=spec.bind_address,
        )
    finally:
        _release()
    return int(jax.process_index())


def _platforms(jax: ModuleType, ours: str) -> str:
    """The user's ``JAX_PLATFORMS`` wins, as on Ray. It is read again here: a worker forked from
    a driver that imported jax has the driver's parsed value, not the runtime env's."""
    return env.jax_platforms() or getattr(jax.config, "jax_platforms", None) or ours


SHUTDOWN_BARRIER_S = 10
"""How long a rank waits in ``jax.distributed.shutdown`` for the others (some may be dead)."""


def shutdown() -> None:
    import jax

    jax.distributed.shutdown()
