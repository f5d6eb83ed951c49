"""Inside each worker: its reserved port and LightGBM's network parameters.

The backend (on the driver) calls :func:`reserve_port_on_rank` and :func:`set_network` on every
rank; the training function reads :func:`get_network_params`; :class:`NetworkContext` wraps it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from dataclasses import dataclass
from types import TracebackType

import phalanx.session as session
from phalanx._gbdt.addresses import reserve_port
from phalanx._gbdt.threads import cpu_share, default_threads

__all__ = ["NetworkContext", "get_network_params", "reserve_port_on_rank", "set_network"]

logger = logging.getLogger(__name__)

# LightGBM's network parameters (num_machines, local_listen_port, machines, time_out).
NetworkParams = dict[str, int | str]


@dataclass
class _GroupState:
    """This process's part of the group: set by the backend's calls, used by the training
    function and NetworkContext."""

    socket: socket.socket | None = None  # the reserved port, until LightGBM listens on it
    params: NetworkParams | None = None
    threads: int | None = None


_state = _GroupState()


def reserve_port_on_rank(hosts: list[str]) -> int:
    """Reserve a free port on this rank's address (``hosts[rank]``); return it."""
    _release()
    host = hosts[session.get_context().get_world_rank()]
    sock = reserve_port(host)
    _state.socket = sock
    return int(sock.getsockname()[1])


def set_network(
    machines: str | None, ports: list[int], time_out: int | None, cpus: float | None
) -> None:
    """Remember this rank's network parameters (None: one worker, no network)."""
    context = session.get_context()
    params: NetworkParams = {}
    if machines is not None:
        params = {
            "num_machines": context.get_world_size(),
            "local_listen_port": ports[context.get_world_rank()],
            "machines": machines,
        }
        if time_out is not None:
            params["time_out"] = time_out
    _state.params = params
    _state.threads = cpu_share(cpus, context.get_local_world_size())


def get_network_params() -> NetworkParams:
    """LightGBM's network parameters for this worker, to merge into ``params``:
    ``num_machines``, ``local_listen_port``, ``machines`` (and ``time_out``); ``{}`` with one
    worker. Call it right before ``lightgbm.train``: it frees this worker's reserved port for
    LightGBM to listen on.

    Example::

        params = {"objective": "regression", **phalanx.lightgbm.get_network_params()}
    """
    params = _state.params
    if params is None:
        logger.warning(
            "get_network_params() was called outside the training function of a "
            "LightGBMTrainer: there is no worker group, so it returns {}."
        )
        return {}
    _release()
    return dict(params)


class NetworkContext:
    """Wraps the training function on every rank: sets the default thread count; afterwards
    forgets the network parameters and frees the reserved port if it was never used."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> NetworkContext:
        threads, _state.threads = _state.threads, None
        if threads:
            self._stack.enter_context(default_threads(threads))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _state.params = None
        _release()
        self._stack.close()


def _release() -> None:
    sock, _state.socket = _state.socket, None
    if sock is not None:
        sock.close()
