"""phalanx's own per-host liveness: a host whose workers all stop answering is lost in seconds.

A host cut off the network sends no FIN and no RST: its packets just stop. Ray notices only when
its GCS misses the node's health checks (about 60 s with Ray's defaults), and nothing fails in
between: the survivors wait in their collective, the progress line stays at the same round.

The driver already holds a channel to every worker that answers even while the training call
runs: the ``drain`` call (handle.py), served by one of the actor's own threads
(``max_concurrency``), never by the thread that runs user code. A live actor answers it as soon
as it has messages, and at the latest ``DRAIN_WAIT_S`` after it arrived, however long a step or a
checkpoint takes (user code that holds the GIL for seconds without a break, in C, is the only
thing that can delay it; torch's operations and collectives release it).

**The rule.** Every answer of a worker is heard; the gap between two answers of one worker is a
sample. The bound is ``min(cap, max(floor, K x p99))`` of the last ``WINDOW`` samples, where
``cap`` is ``PHALANX_HOST_SILENT_S`` (default 3 s) and ``floor`` is ``FLOOR_S`` (2.5 s, or the cap
if lower); before ``MIN_SAMPLES`` samples exist, the cap. A host (the address Ray reports for a
node) is lost when **every** worker on it that has answered at least once has been silent for
the bound: one failure naming the host and its ranks, and every worker of the node is lost with
it (the in-place path then keeps the survivors and places the lost ranks elsewhere). A worker
that has not answered yet (its actor is starting) is not judged. A silence shorter than the bound
costs nothing: the host's answers resume and at most a debug line says so.

Two things never count as silence: the time the poller itself was not looking (a driver that was
starved or busy for longer than ``STALL_S`` moves every clock on by that much), and workers on
the driver's own address (they share its network: they cannot be cut off from it, and a fake
cluster of many raylets on one machine is entirely such workers).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

FLOOR_S = 2.5  # the bound never goes below this (a 1 s blip plus TCP's retransmission, ~1.4 s)
K = 3.0  # times the p99 of the gaps between answers
WINDOW = 512  # gaps kept (across all workers)
MIN_SAMPLES = 20  # fewer: the cap
STALL_S = 0.5  # a poller pass this much later than due: the poller was not looking


class Followed(NamedTuple):
    """One followed worker as the liveness sees it (``worker``: the poller's key for it)."""

    worker: object
    rank: int
    host: str  # the address Ray reports for its node ("" until its hello)
    node_id: str


@dataclass(frozen=True)
class SilentHost:
    """A host declared lost: its address, node, the ranks on it and how long they were silent."""

    host: str
    node_id: str
    ranks: tuple[int, ...]
    silent_s: float
    bound_s: float

    def describe(self) -> str:
        ranks = ", ".join(str(r) for r in self.ranks)
        word = "rank" if len(self.ranks) == 1 else "ranks"
        return f"host {self.host}: no answer from {word} {ranks} for {self.silent_s:.1f} s"


class HostSilence(ConnectionError):
    """Every worker of a host stayed silent past the liveness bound (cut off, or hung)."""

    def __init__(self, silent: SilentHost) -> None:
        self.silent = silent
        super().__init__(
            f"{silent.describe()} (phalanx's liveness bound {silent.bound_s:.1f} s, at most "
            "PHALANX_HOST_SILENT_S: the host is cut off the network, or hung)"
        )


def driver_address() -> str | None:
    """The address Ray reports for the driver's node: workers there are never judged silent."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:
        return None


class HostLiveness:
    """When each followed worker last answered, and which hosts have gone silent.

    Used by the poller thread only. ``local_host``: the driver's own address, never judged.
    """

    def __init__(self, cap_s: float, local_host: str | None = None) -> None:
        self.cap_s = cap_s
        self.floor_s = min(FLOOR_S, cap_s)
        self.local_host = local_host
        self._heard: dict[object, float] = {}  # worker -> when it last answered
        self._gaps: deque[float] = deque(maxlen=WINDOW)
        self._last_pass: float | None = None
        self._quiet_hosts: dict[str, float] = {}  # host -> longest silence seen (debug line)

    def bound_s(self) -> float:
        if len(self._gaps) < MIN_SAMPLES:
            return self.cap_s
        ordered = sorted(self._gaps)
        p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        return min(self.cap_s, max(self.floor_s, K * p99))

    def heard(self, worker: object, host: str, now: float) -> None:
        last = self._heard.get(worker)
        if last is not None:
            self._gaps.append(now - last)
            quiet = self._quiet_hosts.pop(host, None)
            if quiet is not None:
                logger.debug(
                    "host %s answered again after %.1f s of silence (liveness bound %.1f s)",
                    host,
                    quiet,
                    self.bound_s(),
                )
        self._heard[worker] = now

    def forget(self, worker: object) -> None:
        self._heard.pop(worker, None)

    def tick(self, now: float, due_s: float) -> None:
        """A poller pass at ``now``, the previous one due ``due_s`` after it ran: time the poller
        was not looking is nobody's silence."""
        if self._last_pass is not None:
            late = now - self._last_pass - due_s
            if late > STALL_S:
                logger.debug("the poller did not look for %.1f s: liveness clocks moved on", late)
                for worker in self._heard:
                    self._heard[worker] += late
        self._last_pass = now

    def silent_hosts(self, followed: Iterable[Followed], now: float) -> list[SilentHost]:
        """The hosts whose every judged worker has been silent for the bound (each worker of
        ``followed`` that answered once and is not on the driver's address)."""
        by_host: dict[str, list[Followed]] = {}
        for worker in followed:
            if worker.host and worker.host != self.local_host:
                by_host.setdefault(worker.host, []).append(worker)
        bound = self.bound_s()
        lost = []
        for host, workers in by_host.items():
            judged = [w for w in workers if w.worker in self._heard]
            if not judged:
                continue
            silent_s = min(now - self._heard[w.worker] for w in judged)
            if silent_s >= bound:
                ranks = tuple(sorted(w.rank for w in workers))
                lost.append(SilentHost(host, workers[0].node_id, ranks, silent_s, bound))
            elif silent_s >= bound / 2:
                self._quiet_hosts[host] = max(silent_s, self._quiet_hosts.get(host, 0.0))
        return lost

    def lost(self, handles: list[Any], now: float) -> list[tuple[Any, HostSilence]]:
        """For each node of a silent host, its first worker of ``handles`` (Ray worker
        handles, followed, alive) and why: the poller loses it and its node's other workers."""
        items = [Followed(h, h.rank, h.metadata.host, h.metadata.node_id) for h in handles]
        found = []
        for silent in self.silent_hosts(items, now):
            logger.warning(
                "%s: declared lost (phalanx's liveness bound %.1f s, at most "
                "PHALANX_HOST_SILENT_S); its workers are replaced",
                silent.describe(),
                silent.bound_s,
            )
            on_host = [h for h in handles if h.metadata.host == silent.host]
            for node in dict.fromkeys(h.metadata.node_id for h in on_host):
                first = next(h for h in on_host if h.metadata.node_id == node)
                found.append((first, HostSilence(silent)))
        return found
