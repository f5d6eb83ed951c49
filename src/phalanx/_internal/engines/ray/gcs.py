"""Bounded calls to the Ray cluster's control store (the GCS).

``ray.nodes()``, ``ray.available_resources()`` and friends take no timeout: each is a blocking
request to the GCS that Ray's client waits on for as long as it takes. A GCS that stopped
answering (overloaded, paused, on a head node that is going away; a driver still connected to a
cluster that was shut down) would hold ``fit()`` forever with nothing said. So every such call
runs in a short-lived daemon thread, and the caller waits for it at most
``PHALANX_RAY_GCS_TIMEOUT_S`` (60 s by default); past that it gets
:class:`~phalanx.errors.RayClusterUnresponsiveError`, which says what was asked and what to do.

The thread is left to finish on its own: a blocking Ray call cannot be cancelled. It ends when
the GCS answers (or when Ray gives up on it); it holds nothing of the caller's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import ray

from phalanx._foundation import env
from phalanx.errors import RayClusterUnresponsiveError

T = TypeVar("T")

THREAD_NAME = "phalanx-ray-gcs"

HINT = (
    "check that the Ray head node is up and not overloaded (ray status; the GCS log "
    "gcs_server.out in /tmp/ray/session_latest/logs). If this process connected with ray.init() "
    "to a cluster that was shut down since, call ray.shutdown() and connect again. Raise "
    "PHALANX_RAY_GCS_TIMEOUT_S if the cluster is only slow to answer."
)


class _Call:
    """One call in a daemon thread; ``done`` is set once it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name=THREAD_NAME, daemon=True).start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as exc:  # handed to the caller, who re-raises it
            self.error = exc
        finally:
            self.done.set()


def bounded(fn: Callable[[], T], what: str, timeout_s: float | None = None) -> T:
    """``fn()``, a call that waits on the GCS, or RayClusterUnresponsiveError after the bound."""
    limit = env.ray_gcs_timeout_s() if timeout_s is None else timeout_s
    call = _Call(fn)
    if not call.done.wait(limit):
        raise RayClusterUnresponsiveError(
            f"The Ray cluster's control store (GCS) did not answer {what} within {limit:g} s, "
            "so phalanx stopped waiting instead of hanging. The GCS is overloaded or paused, its "
            "head node is gone, or this process is connected to a Ray cluster that no longer "
            f"runs.\nHINT: {HINT}"
        )
    if call.error is not None:
        raise call.error
    return call.value  # type: ignore[no-any-return]


def nodes() -> list[dict[str, Any]]:
    """``ray.nodes()``, bounded."""
    return bounded(ray.nodes, "ray.nodes()")


def available_resources() -> dict[str, float]:
    """``ray.available_resources()``, bounded."""
    return bounded(ray.available_resources, "ray.available_resources()")


def available_per_node(timeout_s: float | None = None) -> dict[str, dict[str, float]] | None:
    """The free resources of each live node, by node id, bounded (``timeout_s``, or
    ``PHALANX_RAY_GCS_TIMEOUT_S``); None where this Ray does not say (it is Ray's own private
    accessor, the one ``ray.available_resources()`` sums)."""
    try:
        from ray._private.state import state

        per_node = state.available_resources_per_node
    except (ImportError, AttributeError):
        return None
    return bounded(per_node, "the free resources per node", timeout_s)


NODE_QUERY_S = 2.0  # the drain thread asks whether a node is dead: it must not stall for long


def node_is_dead(node_id: str) -> bool:
    """Whether the GCS says the node left the cluster; False when it cannot say in time."""
    if not node_id or node_id == "?":
        return False
    try:
        nodes = bounded(ray.nodes, "ray.nodes()", timeout_s=NODE_QUERY_S)
        return any(n["NodeID"] == node_id and not n["Alive"] for n in nodes)
    except Exception:
        return False
