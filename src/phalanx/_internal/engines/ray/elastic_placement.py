"""Elastic placement (``ScalingConfig(num_workers=(min, max))``): the largest group between min
and max that the Ray cluster can place now.

As Ray Train does, every attempt asks for ``max_workers`` first and starts with fewer when that
is all the cluster has, as soon as ``min_workers`` fit. The number that fits is estimated from
the cluster's free resources, then confirmed by placing a group of that size (a node's free
resources are not public, and Ray's scheduler has the last word): if it does not become ready
at once, one worker fewer is tried, down to ``min_workers``. Below that the attempt waits,
saying so every few seconds, up to the start timeout; then it fails as a worker-start failure,
which ``FailureConfig(max_failures=...)`` retries like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from phalanx._internal.engines.base import WorkerGroupSpec
from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.placement import _capacity, _fmt, visible_resources
from phalanx.errors import WorkerStartupError

logger = logging.getLogger(__name__)

PROBE_S = 1.0  # how long a trial group gets to become ready before one worker fewer is tried
RECHECK_S = 1.0  # how often a wait below min_workers looks at the cluster again
# ... and for its first seconds: right after a failed group is released, Ray's view of the free
# resources catches up within a fraction of a second.
FIRST_RECHECKS_S, FIRST_RECHECK_S = 3.0, 0.2

MakeGroup = Callable[[int], PlacementGroup]

# How long the next placement waits for Ray's view to show a removed group's resources free
# again (usually a fraction of a second after the removal; a busy cluster takes longer), and how long after the
# removal that is still worth waiting for.
RELEASE_WAIT_S = 5.0
RELEASE_FRESH_S = 10.0
RELEASE_QUERY_S = 5.0  # the bound on reading a group before its removal (a teardown waits on it)


@dataclass(frozen=True)
class Released:
    """A placement group this driver removed: what it held on each node, and each node's free
    resources just before. Ray's view of the free resources shows them free again only some time
    after the removal. A size estimated in between (the next attempt's, started at once) did not
    count them: a group restarted to grow came back at its old size, again and again; and a
    group asked for while the removal was still on its way was not placed within the probe."""

    at: float
    free_before: Mapping[str, Mapping[str, float]]
    freed: Mapping[str, Mapping[str, float]]

    @classmethod
    def of(cls, groups: Sequence[PlacementGroup], bundle: Mapping[str, float]) -> Released | None:
        """Read before ``groups`` (an attempt's, of bundles ``bundle``) are removed; None where
        the GCS does not say (a group never placed holds nothing)."""
        from ray.util import placement_group_table

        def placed_on() -> list[str]:
            tables = [placement_group_table(g).get("bundles_to_node_id") or {} for g in groups]
            return [node for table in tables for node in table.values()]

        try:
            where = gcs.bounded(placed_on, "placement_group_table()", timeout_s=RELEASE_QUERY_S)
            if not where:
                return None
            before = gcs.available_per_node(RELEASE_QUERY_S)
        except Exception:  # then the next placement does not wait: its size may be low
            logger.debug("Reading the group to be released failed", exc_info=True)
            return None
        if before is None:
            return None
        freed: dict[str, dict[str, float]] = {}
        for node in where:
            held = freed.setdefault(node, {})
            for key, amount in bundle.items():
                held[key] = held.get(key, 0.0) + amount
        return cls(time.monotonic(), before, freed)

    def shown(self, per_node: Mapping[str, Mapping[str, float]], avoid: Collection[str]) -> bool:
        """Whether ``per_node`` (Ray's view) shows every node's part free again; lost nodes and
        nodes that left do not count."""
        for node, freed in self.freed.items():
            if node in avoid or node not in per_node:
                continue
            before, now = self.free_before.get(node, {}), per_node[node]
            if any(now.get(k, 0.0) < before.get(k, 0.0) + v - 1e-6 for k, v in freed.items()):
                return False
        return True

    def wait_shown(self, avoid: Collection[str], timeout_s: float = RELEASE_WAIT_S) -> None:
        """Return once Ray's view shows this group's resources free again, after ``timeout_s``
        (another job may have taken them), or at once if the removal is old news."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() - self.at < RELEASE_FRESH_S:
            per_node = gcs.available_per_node()
            if per_node is None or self.shown(per_node, avoid) or time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def placeable_now(
    bundle: Mapping[str, float], low: int, high: int, avoid_nodes: Collection[str] = ()
) -> int:
    """An upper bound, clamped to ``high``, of how many bundles the free resources hold: node by
    node (a bundle never spans two), not counting ``avoid_nodes`` (nodes whose actors were just
    lost: until the GCS declares such a node dead, ~15-30 s with Ray's default health checks, it
    looks alive). Where Ray does not give the free resources per node, from the cluster's sum."""
    per_node = gcs.available_per_node()
    if per_node is None:
        count = _capacity(bundle, visible_resources(gcs.available_resources()))
    else:
        count = sum(
            _capacity(bundle, visible_resources(free))
            for node, free in per_node.items()
            if node not in avoid_nodes
        )
    return max(0, min(high, count))


def place_elastic(
    spec: WorkerGroupSpec,
    bundle: Mapping[str, float],
    make_group: MakeGroup,
    log_every_s: float,
    avoid_nodes: Collection[str] = (),
    released: Released | None = None,
) -> tuple[PlacementGroup, int]:
    """A ready placement group of n bundles, min_workers <= n <= num_workers, and n
    (``make_group`` keeps the bundles off ``avoid_nodes``; ``released``: see :class:`Released`)."""
    assert spec.min_workers is not None
    low, high = spec.min_workers, spec.num_workers
    if released is not None:
        released.wait_shown(avoid_nodes)
    started = time.monotonic()
    last_log = started - log_every_s  # the first wait is said at once, then every log_every_s
    while True:
        placed = _try_sizes(bundle, low, high, make_group, avoid_nodes)
        if placed is not None:
            group, size = placed
            if size < high:
                logger.warning(
                    "Elastic num_workers=(%d, %d): the Ray cluster can place %d workers of %s "
                    "now; starting with %d.",
                    low,
                    high,
                    size,
                    _fmt(bundle),
                    size,
                )
            return group, size
        now = time.monotonic()
        if now - started > spec.start_timeout_s:
            raise WorkerStartupError.of(list(range(low)), _below_min(spec, bundle), _HINT)
        if now - last_log >= log_every_s:
            last_log = now
            logger.warning(
                "Waiting %.0f s for the Ray cluster to place at least %d workers of %s "
                "(min_workers of num_workers=(%d, %d), strategy %s); available now: %s.",
                now - started,
                low,
                _fmt(bundle),
                low,
                high,
                spec.scaling_config.placement_strategy,
                _fmt(visible_resources(gcs.available_resources())),
            )
        time.sleep(FIRST_RECHECK_S if now - started < FIRST_RECHECKS_S else RECHECK_S)


def _try_sizes(
    bundle: Mapping[str, float],
    low: int,
    high: int,
    make_group: MakeGroup,
    avoid_nodes: Collection[str],
) -> tuple[PlacementGroup, int] | None:
    """The largest size from the estimate down to ``low`` whose group becomes ready."""
    for size in range(placeable_now(bundle, low, high, avoid_nodes), low - 1, -1):
        group = make_group(size)
        if ray.wait([group.ready()], timeout=PROBE_S)[0]:
            return group, size
        remove_placement_group(group)
    return None


def _below_min(spec: WorkerGroupSpec, bundle: Mapping[str, float]) -> str:
    return (
        f"the Ray cluster could not place min_workers={spec.min_workers} workers of "
        f"{_fmt(bundle)} within {spec.start_timeout_s:g} s (ScalingConfig(num_workers="
        f"({spec.min_workers}, {spec.num_workers}))); available now: "
        f"{_fmt(visible_resources(gcs.available_resources()))}"
    )


_HINT = (
    "add nodes (or wait for the ones that left to come back), lower min_workers, or raise "
    "PHALANX_WORKER_START_TIMEOUT_S to wait longer. The attempt is retried under "
    "FailureConfig(max_failures=...)."
)
