"""In-place recovery: after a failed attempt, the surviving actors serve the next one.

A failed attempt's group is *parked* instead of killed: each live actor ends its training call
(the session's next ``report()`` raises, and the call's Python code at once), kills what the call
started and leaves the framework's process group (the backend's ``reset_worker``). A call that
does not end at once is waiting in C code, typically in a collective with a peer that is gone
(whose host was cut off: nothing tells the survivors): the backend's ``abort_worker`` aborts the
process group (``phalanx.torch._abort``), the collective raises and the call ends. An actor that
still does not manage within ``PHALANX_REUSE_STOP_S``, or whose messages cannot be read, is
killed like a lost one. The placement group stays: the next
launch (module ``relaunch``) starts actors only for the lost ranks, in their old bundles (Ray
places a dead node's bundles again on the nodes that remain) or, for a node lost but not yet
declared dead by the GCS (~15-30 s with Ray's default health checks), in a new group placed off
it at once; it reassigns ranks, and every rank restarts the training function in the process it
has, imports and CUDA context kept.

An elastic group (``ScalingConfig(num_workers=(min, max))``) is parked the same way and its size
chosen again around the survivors (:func:`elastic_size`): they keep their processes and their
bundles; the group is as large as what they hold, the free bundles of the run's groups on live
nodes, and what the cluster can place now (off the lost nodes) allow, up to max_workers. Below
min_workers the survivors are let go and the attempt is placed afresh (it waits for min_workers
as at the start). A lost node's bundles stay in the group (Ray places them again once a node
has room): they are counted as free slots, so the group grows back (a restart, as Ray Train
does) once they are placed.

Not parked, but torn down as before (``PHALANX_RESTORE_MODE=full`` forces it): a backend without
a ``reset_worker`` (its framework state cannot be reset in a live process), a failure no retry
follows, or a group with no survivor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import cloudpickle
import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.elastic_placement import PROBE_S, placeable_now
from phalanx._internal.engines.ray.handle import RayWorkerHandle

logger = logging.getLogger(__name__)

RESET_SLACK_S = 5.0  # past the actor's own bound: the answer's way back, the output's flush


Place = tuple[PlacementGroup, int]  # a bundle: its placement group and index


@dataclass
class Attempt:
    """One launch: its placement group and its actors; ``elastic_bundle``: each worker's bundle,
    where the group was sized elastically (once it is removed, the next elastic placement waits
    for Ray's view to show its resources free)."""

    group: PlacementGroup
    handles: list[RayWorkerHandle]
    elastic_bundle: dict[str, float] | None = None
    reset_worker: Callable[[], None] | None = None  # None: its actors are never reused
    # In-place recovery: groups of the bundles that replace those of a node not yet dead
    patches: list[PlacementGroup] = field(default_factory=list)
    # Elastic in-place recovery: bundles of these groups that no actor holds (a lost node's,
    # placed again by Ray once a node has room): free slots for the next attempt or a growth
    idle: list[Place] = field(default_factory=list)
    # What started its actors (``start.ActorStarter``): park starts the lost workers' new
    # actors with it while the survivors' training calls end
    starter: Any = None
    # The backend's abort_worker: frees a survivor waiting in a collective (None: none)
    abort: Callable[[], None] | None = None


@dataclass
class Parked:
    """A failed attempt kept for the next one: its launch record (placement group and handles)
    and the actors that survived, by bundle index."""

    attempt: Attempt
    kept: dict[int, RayWorkerHandle]
    lost: dict[int, RayWorkerHandle]  # the others: dead, or killed because not reusable
    # New actors for workers found dead at park, started then (by index), and their hellos
    early: dict[int, tuple[RayWorkerHandle, Any]] = field(default_factory=dict)


def moved_off_its_node(lost: RayWorkerHandle) -> bool:
    """Whether a lost rank's new actor needs a bundle elsewhere: its node is lost, and the GCS
    does not say it is dead yet, so Ray would not place the old bundle again until it does."""
    return lost.node_lost and not gcs.node_is_dead(lost.metadata.node_id)


def can_park(handles: list[RayWorkerHandle], reset_worker: Callable[[], None] | None) -> bool:
    """Whether the group's survivors may be kept (see the module's docstring)."""
    if reset_worker is None:
        return False
    return any(h.is_alive() and h.broken is None for h in handles)


def reset_survivors(
    handles: list[RayWorkerHandle],
    reset_worker: Callable[[], None],
    timeout_s: float,
    abort: Callable[[], None] | None = None,
) -> tuple[list[RayWorkerHandle], dict[int, str]]:
    """Reset every live actor for reuse (``abort``: frees one waiting in a collective); returns
    those that are ready, and why each other (by rank) is not."""
    payload = cloudpickle.dumps((reset_worker, (), {}))
    abort_payload = cloudpickle.dumps((abort, (), {})) if abort is not None else None
    alive = [h for h in handles if h.is_alive() and h.broken is None]
    refs = {h: h.actor.reset.remote(timeout_s, payload, abort_payload) for h in alive}
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


def usable_bundles(places: Collection[Place], avoid: Collection[str]) -> list[Place]:
    """Those of ``places`` (bundles of the run's groups that no actor holds) that Ray has placed
    on a live node that placements do not avoid now, in the order given."""
    from ray.util import placement_group_table

    if not places:
        return []
    alive = {n["NodeID"] for n in gcs.nodes() if n.get("Alive")}
    nodes_of: dict[Any, Mapping[int, str]] = {}
    usable = []
    for group, index in places:
        if group.id not in nodes_of:
            table = gcs.bounded(partial(placement_group_table, group), "placement_group_table()")
            nodes_of[group.id] = table.get("bundles_to_node_id") or {}
        node = nodes_of[group.id].get(index)
        if node is not None and node in alive and node not in avoid:
            usable.append((group, index))
    return usable


def elastic_size(
    kept: int, spare: int, bundle: Mapping[str, float], high: int, avoid: Collection[str]
) -> int:
    """The size of an elastic group's next attempt around ``kept`` survivors: with ``spare``
    free bundles of its own and what the cluster can place now off ``avoid``, at most ``high``
    (the caller places the group afresh when that is below min_workers)."""
    extra = placeable_now(bundle, 0, high, avoid) if kept + spare < high else 0
    return min(high, kept + spare + extra)


def place_extra(
    make_group: Callable[[int], PlacementGroup], want: int, least: int
) -> tuple[PlacementGroup, int] | None:
    """A ready group of ``want`` new bundles, or of one fewer each time one is not placed within
    ``PROBE_S``, down to ``least`` (>= 1): (the group, its size); None when none fits."""
    for size in range(want, max(least, 1) - 1, -1):
        group = make_group(size)
        if ray.wait([group.ready()], timeout=PROBE_S)[0]:
            return group, size
        remove_placement_group(group)
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
