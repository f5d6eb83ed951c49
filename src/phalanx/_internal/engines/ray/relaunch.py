"""The next attempt in a parked group (in-place recovery, see ``reuse``): the survivors serve it
in their processes; new actors start only where workers were lost.

A fixed-size group (:func:`relaunch`) keeps every worker's index: a lost worker's new actor goes
to its old bundle (Ray places a dead node's bundles again), or, for a node the GCS does not yet
declare dead, to a bundle of a new group placed off that node now. An elastic group
(:func:`relaunch_elastic`) is sized again around its survivors: they become workers ``0..k-1``;
new actors go to free bundles of the run's groups, then to a new group off the lost nodes, up to
max_workers.

When starting fails, ``attempt.handles`` names every actor started, kept or new, so that the
engine's release of the attempt kills them all; the exception goes on to the engine.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from ray.util.placement_group import PlacementGroup

from phalanx._internal.engines.ray.handle import RayWorkerHandle
from phalanx._internal.engines.ray.reuse import (
    Attempt,
    Parked,
    Place,
    elastic_size,
    moved_off_its_node,
    place_extra,
    usable_bundles,
)
from phalanx._internal.engines.ray.start import ActorStarter

logger = logging.getLogger(__name__)


def relaunch(parked: Parked, starter: ActorStarter, avoid: list[str]) -> list[RayWorkerHandle]:
    """The next attempt of the same size: the kept actors serve it, new actors start in the
    lost workers' bundles (or off ``avoid``, the lost nodes), hellos from those."""
    attempt, spec = parked.attempt, starter.spec
    early = {i: e for i, e in parked.early.items() if e[0].is_alive()}
    fresh: list[RayWorkerHandle] = []
    hellos: list[Any] = []
    try:
        lost = {i: h for i, h in parked.lost.items() if i not in parked.kept and i not in early}
        places = lost_bundles(attempt, lost, starter, avoid)
        for index in range(spec.num_workers):
            kept = parked.kept.get(index)
            if kept is not None:
                kept.rebind(starter.events, spec.log_dir, spec.attempt)
            elif index in early:  # started at park, while the survivors were reset
                handle, hello = early[index]
                handle.rebind(starter.events, spec.log_dir, spec.attempt)
                fresh.append(handle)
                hellos.append(hello)
            else:
                group, at = places[index]
                fresh.append(starter.start(group, index, at))
                hellos += starter.send_hellos(fresh[-1:])
        attempt.handles = sorted([*parked.kept.values(), *fresh], key=lambda h: h.index)
        logger.debug("relaunch: %d new actor(s), %d started at park", len(fresh), len(early))
        if fresh:
            starter.await_hellos(fresh, hellos)
    except BaseException:
        attempt.handles = [*parked.kept.values(), *fresh]
        raise
    return list(attempt.handles)


def prestart(
    attempt: Attempt, dead: list[RayWorkerHandle], avoid: list[str]
) -> dict[int, tuple[RayWorkerHandle, Any]]:
    """New actors for the ``dead`` workers of a fixed-size group, started now (at park) with
    the attempt's own starter, and their hellos: their processes start while the survivors'
    training calls end. ``relaunch`` rebinds them to the next attempt."""
    starter = attempt.starter
    if starter is None or attempt.elastic_bundle is not None or not dead:
        return {}
    lost = {h.index: h for h in dead}
    places = lost_bundles(attempt, lost, starter, avoid)
    early = {}
    for index in sorted(lost):
        group, at = places[index]
        handle = starter.start(group, index, at)
        early[index] = (handle, starter.send_hellos([handle])[0])
    return early


def relaunch_elastic(
    parked: Parked, starter: ActorStarter, avoid: list[str]
) -> list[RayWorkerHandle] | None:
    """An elastic group's next attempt around its survivors (module ``reuse``): they serve it
    in their processes, renumbered first; new actors go to free bundles of the group, then to a
    new group off ``avoid``. None when fewer than min_workers fit."""
    spec = starter.spec
    assert spec.min_workers is not None
    attempt, kept = parked.attempt, sorted(parked.kept.values(), key=lambda h: h.index)
    free = [*attempt.idle, *(h.placement for h in parked.lost.values() if h.placement)]
    low, high = spec.min_workers, spec.num_workers
    places = _places_around(attempt, len(kept), free, starter, avoid)
    if len(kept) + len(places) < low:
        return None
    used = {(g.id, i) for g, i in places}
    attempt.idle = [(g, i) for g, i in free if (g.id, i) not in used]
    logger.warning(
        "Elastic in-place recovery: %d worker(s) kept, %d new; the group runs at %d "
        "(num_workers=(%d, %d)).",
        len(kept),
        len(places),
        len(kept) + len(places),
        low,
        high,
    )
    return _start_around(attempt, kept, places, starter)


def _places_around(
    attempt: Attempt, kept: int, free: list[Place], starter: ActorStarter, avoid: list[str]
) -> list[Place]:
    """Bundles for the new actors of an elastic group around ``kept`` survivors: free ones
    of its groups first, then a new group off the lost nodes, as many as fit up to
    max_workers; fewer than min_workers - kept when that is all."""
    assert starter.spec.min_workers is not None
    low, high = starter.spec.min_workers, starter.spec.num_workers
    spare = usable_bundles(free, avoid)
    size = elastic_size(kept, len(spare), starter.bundle, high, avoid)
    places = spare[: max(0, size - kept)]
    need = size - kept - len(places)
    if size >= low and need > 0:
        suffix = f":patch{len(attempt.patches) + 1}"
        make = partial(starter.placement_group, avoid_nodes=avoid, suffix=suffix)
        placed = place_extra(make, need, low - kept - len(places))
        if placed is not None:
            attempt.patches.append(placed[0])
            places += [(placed[0], j) for j in range(placed[1])]
    return places


def _start_around(
    attempt: Attempt, kept: list[RayWorkerHandle], places: list[Place], starter: ActorStarter
) -> list[RayWorkerHandle]:
    """The kept actors as workers ``0..k-1``, new actors in ``places`` after them."""
    spec = starter.spec
    fresh: list[RayWorkerHandle] = []
    try:
        for index, handle in enumerate(kept):
            handle.rebind(starter.events, spec.log_dir, spec.attempt, index)
        for offset, (group, at) in enumerate(places):
            fresh.append(starter.start(group, len(kept) + offset, at))
        attempt.handles = [*kept, *fresh]
        starter.greet(fresh)
    except BaseException:
        attempt.handles = [*kept, *fresh]
        raise
    return list(attempt.handles)


def lost_bundles(
    attempt: Attempt, lost: dict[int, RayWorkerHandle], starter: ActorStarter, avoid: list[str]
) -> dict[int, tuple[PlacementGroup, int]]:
    """Where each ``lost`` worker's new actor goes: its old bundle (Ray places it again if its
    node died), or, for a node the GCS does not yet say is dead (~15-30 s with Ray's
    default health checks), a bundle of a new group placed off that node now."""
    soft = starter.spec.scaling_config.placement_strategy in ("PACK", "SPREAD")
    moved = [i for i, h in sorted(lost.items()) if soft and moved_off_its_node(h)]
    places = {i: h.placement or (attempt.group, i) for i, h in lost.items()}
    if moved:
        logger.info(
            "In-place recovery: the new actors of worker(s) %s go to a new placement group "
            "off the lost node(s), which Ray does not declare dead yet",
            moved,
        )
        suffix = f":patch{len(attempt.patches) + 1}"
        patch = starter.placement_group(len(moved), avoid_nodes=avoid, suffix=suffix)
        attempt.patches.append(patch)
        places.update({index: (patch, j) for j, index in enumerate(moved)})
    return places
