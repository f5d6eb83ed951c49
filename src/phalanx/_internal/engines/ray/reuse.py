"""In-place recovery: after a failed attempt, the surviving actors serve the next one.

A failed attempt's group is *parked* instead of killed: each live actor ends its training call
(the session's next ``report()`` raises, and the call's Python code at once), kills what the call
started and leaves the framework's process group (the backend's ``reset_worker``). An actor that
does not manage within ``PHALANX_REUSE_STOP_S`` (a call blocked in a collective or in C code), or
whose messages cannot be read, is killed like a lost one. The placement group stays: the next
launch starts actors only for the lost ranks, in their old bundles (Ray places a dead node's
bundles again on the nodes that remain) or, for a node lost but not yet declared dead by the
GCS (~15-30 s with Ray's default health checks), in a new group placed off it at once; it
reassigns ranks, and every rank restarts the training function in the process it has, imports
and CUDA context kept.

Not parked, but torn down as before (``PHALANX_RESTORE_MODE=full`` forces it): a backend without
a ``reset_worker`` (its framework state cannot be reset in a live process), an elastic group (its
size is chosen again), a failure no retry follows, or a group with no survivor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import ray

from phalanx._internal.engines.ray.handle import RayWorkerHandle, _node_is_dead

logger = logging.getLogger(__name__)

RESET_SLACK_S = 5.0  # past the actor's own bound: the answer's way back, the output's flush


@dataclass
class Parked:
    """A failed attempt kept for the next one: its launch record (placement group and handles)
    and the actors that survived, by bundle index."""

    attempt: Any  # engine._Attempt
    kept: dict[int, RayWorkerHandle]
    lost: dict[int, RayWorkerHandle]  # the others: dead, or killed because not reusable


def moved_off_its_node(lost: RayWorkerHandle) -> bool:
    """Whether a lost rank's new actor needs a bundle elsewhere: its node is lost, and the GCS
    does not say it is dead yet, so Ray would not place the old bundle again until it does."""
    return lost.node_lost and not _node_is_dead(lost.metadata.node_id)


def can_park(handles: list[RayWorkerHandle], reset_worker: Callable[[], None] | None) -> bool:
    """Whether the group's survivors may be kept (see the module's docstring)."""
    if reset_worker is None:
        return False
    return any(h.is_alive() and h.broken is None for h in handles)


def reset_survivors(
    handles: list[RayWorkerHandle], reset_worker: Callable[[], None], timeout_s: float
) -> tuple[list[RayWorkerHandle], dict[int, str]]:
    """Reset every live actor for reuse; returns those that are ready, and why each other (by
    rank) is not."""
    payload = cloudpickle.dumps((reset_worker, (), {}))
    alive = [h for h in handles if h.is_alive() and h.broken is None]
    refs = {h: h.actor.reset.remote(timeout_s, payload) for h in alive}
    deadline = time.monotonic() + timeout_s + RESET_SLACK_S
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s + 1.0)
    kept, why = [], {}
    for handle, ref in refs.items():
        reason = _reset_outcome(handle, ref, ref in ready, deadline)
        if reason is None:
            kept.append(handle)
        else:
            why[handle.rank] = reason
    return kept, why


def _reset_outcome(
    handle: RayWorkerHandle, ref: Any, answered: bool, deadline: float
) -> str | None:
    """None when ``handle`` is ready for the next attempt, else why it is not."""
    if not answered:
        return "it did not answer"
    try:
        ok, sent, reason = ray.get(ref)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if not ok:
        return str(reason)
    while handle.confirmed < sent:  # the old attempt's last messages reach the old attempt
        if time.monotonic() > deadline or not handle.is_alive() or handle.broken is not None:
            return "its last messages did not arrive"
        time.sleep(0.01)
    return None


def log_reuse(kept: list[RayWorkerHandle], total: int, why: dict[int, str]) -> None:
    ranks = sorted(h.rank for h in kept)
    detail = "".join(f"\n  rank {rank}: {reason}" for rank, reason in sorted(why.items()))
    if not kept:
        logger.warning("In-place recovery: no Ray actor can be kept; all are replaced.%s", detail)
        return
    logger.warning(
        "In-place recovery: keeping the Ray actors of rank(s) %s (%d of %d); the others are "
        "replaced.%s",
        ranks,
        len(kept),
        total,
        detail,
    )
