"""RayEngine: workers are Ray actors, one per worker, inside one placement group per attempt.

Only Ray Core is used (actors, placement groups). The placement group has one bundle per worker,
``resources_per_worker`` (Ray Train's defaults), placed with ``placement_strategy``. A request
the cluster can never satisfy fails at once (:meth:`RayEngine.check`); one that needs resources
that are busy now waits, and logs every few seconds that it waits and for what.

What runs in each actor is in ``actor``; the driver's side of an actor and the thread that
drains every actor's messages are in ``handle``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from phalanx._internal import env
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events
from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.actor import PhalanxWorker
from phalanx._internal.engines.ray.elastic import Released, place_elastic, placeable_now
from phalanx._internal.engines.ray.handle import DrainPoller, RayWorkerHandle
from phalanx._internal.engines.ray.placement import (
    _fmt,
    actor_options,
    infeasibility,
    label_options,
    visible_resources,
    worker_bundle,
)
from phalanx._internal.engines.ray.reuse import (
    Parked,
    can_park,
    log_reuse,
    moved_off_its_node,
    reset_survivors,
)
from phalanx._internal.storage.run_storage import LOG_DIR, MARKER_FILE
from phalanx.config import ScalingConfig
from phalanx.errors import (
    ConfigError,
    RayClusterUnresponsiveError,
    StorageError,
    WorkerStartupError,
)

logger = logging.getLogger(__name__)

ACTOR_CONCURRENCY = 8  # calls, drain, stop, stacks... answered while a training call runs
WAIT_LOG_EVERY_S = 10.0  # how often a placement that waits for resources says so
STOP_FLUSH_S = 0.5  # how long a stopping worker gets to send its last output lines
GONE_TIMEOUT_S = 5.0
# A node whose actors were lost with it (unreachable) still looks alive, its resources free, until
# the GCS declares it dead (~30 s with Ray's default health checks): placements keep off it this
# long, so a restart neither waits on it nor sizes an elastic group by its phantom capacity. A
# node that was only cut off for a while is used again after.
AVOID_LOST_NODE_S = 120.0

_RemoteWorker = ray.remote(PhalanxWorker)

START_HINT = (
    "check the Ray logs of those actors (ray logs, or /tmp/ray/session_latest/logs); raise "
    "PHALANX_WORKER_START_TIMEOUT_S if starting is only slow. The attempt is retried under "
    "FailureConfig(max_failures=...)."
)


@dataclass
class _Attempt:
    """One launch: its placement group and its actors; ``elastic_bundle``: each worker's bundle,
    where the group was sized elastically (once it is removed, the next elastic placement waits
    for Ray's view to show its resources free)."""

    group: PlacementGroup
    handles: list[RayWorkerHandle]
    elastic_bundle: dict[str, float] | None = None
    reset_worker: Callable[[], None] | None = None  # None: its actors are never reused
    # In-place recovery: groups of the bundles that replace those of a node not yet dead
    patches: list[PlacementGroup] = field(default_factory=list)


def ensure_ray() -> None:
    """Connect to the cluster (``RAY_ADDRESS``) or start a local one, unless already done."""
    if ray.is_initialized():
        return
    address = env.ray_address()
    if address:
        logger.info("Connecting to the Ray cluster at %s", address)
        ray.init(address=address)
    else:
        logger.info("Starting a local Ray instance for the Ray engine")
        ray.init(include_dashboard=False)


def driver_sys_path() -> list[str]:
    """The driver's import path as absolute directories ('' is the driver's working directory)."""
    return [os.path.abspath(p or os.curdir) for p in sys.path]


def alive_node_resources() -> list[dict[str, float]]:
    return [visible_resources(n["Resources"]) for n in gcs.nodes() if n.get("Alive")]


class RayEngine(Engine):
    """Workers as Ray actors. Connects to Ray (or starts it) at the first ``check``/``launch``."""

    name = "ray"
    process_per_worker = True
    sizes_elastic_groups = True

    def __init__(self) -> None:
        self._poller: DrainPoller | None = None
        self._attempts: list[_Attempt] = []
        self._lost_nodes: dict[str, float] = {}  # node id -> when its actors were lost
        self._released: Released | None = None  # the last elastic group this engine removed
        self._parked: Parked | None = None  # a failed attempt whose survivors serve the next

    def _avoid_nodes(self) -> list[str]:
        now = time.monotonic()
        self._lost_nodes = {
            n: at for n, at in self._lost_nodes.items() if now - at < AVOID_LOST_NODE_S
        }
        return sorted(self._lost_nodes)

    # -- before anything starts -----------------------------------------------------------------

    def check(self, scaling_config: ScalingConfig) -> None:
        ensure_ray()
        bundle = worker_bundle(scaling_config)
        nodes = alive_node_resources()
        why = infeasibility(  # elastic: the run can start once min_workers fit
            bundle, scaling_config.min_workers, scaling_config.placement_strategy, nodes
        )
        if why is not None:
            raise ConfigError(
                f"ScalingConfig(num_workers={scaling_config.num_workers!r}, resources_per_worker="
                f"{scaling_config.resources_per_worker!r}, use_gpu={scaling_config.use_gpu}, "
                f"placement_strategy={scaling_config.placement_strategy!r}) can never be placed on "
                f"this Ray cluster: {why}.\nHINT: lower num_workers or resources_per_worker, "
                "or add nodes with these resources to the cluster."
            )

    def free_worker_slots(self, scaling_config: ScalingConfig) -> int:
        try:
            bundle, most = worker_bundle(scaling_config), scaling_config.max_workers
            return placeable_now(bundle, 0, most, self._avoid_nodes())
        except RayClusterUnresponsiveError as exc:  # no growth now; the run itself goes on
            logger.warning("Not resizing the worker group now: %s", exc)
            return 0

    # -- launch ---------------------------------------------------------------------------------

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        if self._poller is None:
            self._poller = DrainPoller()
        bundle = worker_bundle(spec.scaling_config)
        parked, self._parked = self._parked, None
        if parked is not None:  # placed already: a new node may still be on its way
            if spec.min_workers is None and spec.num_workers == len(parked.attempt.handles):
                return self._relaunch(parked, spec, bundle, events)
            self._release(parked.attempt)
        if spec.min_workers is None:  # elastic: checked at fit(); a lost node may come back
            self.check(spec.scaling_config)
        avoid = self._avoid_nodes()
        if avoid:
            logger.info("Placing the workers off the node(s) lost last attempt: %s", avoid)
        make_group = partial(_placement_group, spec, bundle, avoid_nodes=avoid)
        elastic = spec.min_workers is not None
        if elastic:
            group, size = place_elastic(
                spec, bundle, make_group, WAIT_LOG_EVERY_S, avoid, self._released
            )
            spec = replace(spec, num_workers=size)
        else:
            group = make_group(spec.num_workers)
        reset = None if elastic or env.restore_mode() == "full" else spec.reset_worker
        attempt = _Attempt(group, [], bundle if elastic else None, reset)
        self._attempts.append(attempt)
        try:
            # The actors and their hellos go out before the group is placed: Ray queues them
            # and starts each worker process the moment its bundle is committed, without a
            # round trip through the driver (the group's creation overlaps the actors').
            attempt.handles = self._start_actors(group, bundle, spec, events)
            marker = run_marker(spec)
            hellos = [h.actor.hello.remote(marker) for h in attempt.handles]
            self._wait_for_placement(group, spec, bundle)
            self._await_hellos(attempt.handles, hellos, spec)
        except BaseException as exc:
            self._start_failed(attempt, spec, exc)
        return list(attempt.handles)

    def _relaunch(
        self, parked: Parked, spec: WorkerGroupSpec, bundle: dict[str, float], events: Events
    ) -> list[WorkerHandle]:
        """The next attempt in the parked group: the kept actors serve it, new actors start in
        the lost ranks' bundles (Ray places a dead node's bundles again), hellos from those."""
        attempt = parked.attempt
        fresh: list[RayWorkerHandle] = []
        try:
            places = self._lost_bundles(parked, spec, bundle)
            for index in range(spec.num_workers):
                kept = parked.kept.get(index)
                if kept is not None:
                    kept.rebind(events, spec.log_dir, spec.attempt)
                else:
                    group, at = places[index]
                    fresh.append(self._start_actor(group, bundle, spec, events, index, at))
            attempt.handles = sorted([*parked.kept.values(), *fresh], key=lambda h: h.index)
            if fresh:
                marker = run_marker(spec)
                hellos = [h.actor.hello.remote(marker) for h in fresh]
                self._await_hellos(fresh, hellos, spec)
        except BaseException as exc:
            attempt.handles = [*parked.kept.values(), *fresh]
            self._start_failed(attempt, spec, exc)
        return list(attempt.handles)

    def _lost_bundles(
        self, parked: Parked, spec: WorkerGroupSpec, bundle: dict[str, float]
    ) -> dict[int, tuple[PlacementGroup, int]]:
        """Where each lost rank's new actor goes: its old bundle (Ray places it again if its
        node died), or, for a node the GCS does not yet say is dead (~15-30 s with Ray's
        default health checks), a bundle of a new group placed off that node now."""
        lost = {i: h for i, h in parked.lost.items() if i not in parked.kept}
        soft = spec.scaling_config.placement_strategy in ("PACK", "SPREAD")
        moved = [i for i, h in sorted(lost.items()) if soft and moved_off_its_node(h)]
        places = {i: h.placement or (parked.attempt.group, i) for i, h in lost.items()}
        if moved:
            logger.info(
                "In-place recovery: the new actors of worker(s) %s go to a new placement group "
                "off the lost node(s), which Ray does not declare dead yet",
                moved,
            )
            suffix = f":patch{len(parked.attempt.patches) + 1}"
            avoid = self._avoid_nodes()
            patch = _placement_group(spec, bundle, len(moved), avoid_nodes=avoid, suffix=suffix)
            parked.attempt.patches.append(patch)
            places.update({index: (patch, j) for j, index in enumerate(moved)})
        return places

    def _start_failed(self, attempt: _Attempt, spec: WorkerGroupSpec, exc: BaseException) -> None:
        self._release(attempt)
        if isinstance(exc, ConfigError | StorageError | WorkerStartupError):
            raise exc
        if not isinstance(exc, Exception):  # Ctrl-C
            raise exc
        why = f"creating the Ray actors failed: {type(exc).__name__}: {exc}"
        raise WorkerStartupError.of(list(range(spec.num_workers)), why, START_HINT) from exc

    def _wait_for_placement(
        self, group: PlacementGroup, spec: WorkerGroupSpec, bundle: dict[str, float]
    ) -> None:
        """Wait until the cluster has the resources; say so every WAIT_LOG_EVERY_S."""
        ready = group.ready()
        started = last_log = time.monotonic()
        while not ray.wait([ready], timeout=1.0)[0]:
            now = time.monotonic()
            if now - last_log < WAIT_LOG_EVERY_S:
                continue
            last_log = now
            self.check(spec.scaling_config)  # nodes may have left for good
            logger.warning(
                "Waiting %.0f s for the Ray cluster to place %d workers of %s "
                "(strategy %s); available now: %s. Other jobs may hold these resources.",
                now - started,
                spec.num_workers,
                _fmt(bundle),
                spec.scaling_config.placement_strategy,
                _fmt(visible_resources(gcs.available_resources())),
            )

    def _start_actors(
        self,
        group: PlacementGroup,
        bundle: dict[str, float],
        spec: WorkerGroupSpec,
        events: Events,
    ) -> list[RayWorkerHandle]:
        return [
            self._start_actor(group, bundle, spec, events, index)
            for index in range(spec.num_workers)
        ]

    def _start_actor(
        self,
        group: PlacementGroup,
        bundle: dict[str, float],
        spec: WorkerGroupSpec,
        events: Events,
        index: int,
        bundle_index: int | None = None,
    ) -> RayWorkerHandle:
        """Worker ``index``'s actor in bundle ``bundle_index`` (default: ``index``) of ``group``."""
        assert self._poller is not None
        bundle_index = index if bundle_index is None else bundle_index
        actor = _RemoteWorker.options(  # type: ignore[attr-defined]
            **actor_options(bundle),
            max_concurrency=ACTOR_CONCURRENCY,
            max_restarts=0,
            **({"runtime_env": dict(spec.runtime_env)} if spec.runtime_env else {}),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=bundle_index
            ),
        ).remote(dict(spec.env), driver_sys_path())
        handle = RayWorkerHandle(index, actor, events, spec.log_dir, spec.attempt)
        handle.placement = (group, bundle_index)
        self._poller.add(handle)  # so output printed while starting reaches the driver
        return handle

    def _await_hellos(
        self, handles: list[RayWorkerHandle], refs: list[Any], spec: WorkerGroupSpec
    ) -> None:
        """Wait for every actor's ``hello`` (sent at creation), counted from the group's placement."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=spec.start_timeout_s)
        late = [h.index for h, ref in zip(handles, refs, strict=True) if ref not in ready]
        if late:
            why = (
                f"no hello within {spec.start_timeout_s:g} s (the placement group was ready, "
                "so the actors were scheduled)"
            )
            raise WorkerStartupError.of(late, why, START_HINT)
        problems = {}
        for handle, ref in zip(handles, refs, strict=True):
            try:
                info = ray.get(ref)
            except RayActorError as exc:
                why = f"the Ray actor failed to start: {exc}"
                raise WorkerStartupError.of([handle.index], why, START_HINT) from exc
            handle.metadata = WorkerMetadata(
                info["host"], info["node_id"], info["pid"], info["gpu_ids"]
            )
            if info["storage_problem"]:
                problems[handle.index] = (info["host"], info["node_id"], info["storage_problem"])
        if problems:
            raise _storage_error(problems)

    # -- stop -----------------------------------------------------------------------------------

    def park(self, handles: list[WorkerHandle]) -> None:
        """Keep the survivors of a failed attempt for the next (module ``reuse``); stop the rest."""
        ours = [h for h in handles if isinstance(h, RayWorkerHandle)]
        attempt = next((a for a in self._attempts if set(a.handles) == set(ours)), None)
        if attempt is None or not can_park(ours, attempt.reset_worker):
            self.shutdown(handles, 0.0)
            return
        assert attempt.reset_worker is not None
        self._note_lost_nodes(ours)
        kept, why = reset_survivors(ours, attempt.reset_worker, env.reuse_stop_s())
        log_reuse(kept, len(ours), why)
        gone = [h for h in ours if h not in kept]
        for handle in gone:
            handle.kill()
        _wait_gone([h for h in gone if h.is_alive()], GONE_TIMEOUT_S)
        for handle in gone:
            handle.finish()
        if kept:
            self._parked = Parked(attempt, {h.index: h for h in kept}, {h.index: h for h in gone})
        else:
            self._release(attempt)

    def _note_lost_nodes(self, handles: list[RayWorkerHandle]) -> None:
        for handle in handles:
            if handle.node_lost and handle.metadata.node_id:
                self._lost_nodes[handle.metadata.node_id] = time.monotonic()

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        ours = [h for h in handles if isinstance(h, RayWorkerHandle)]
        self._note_lost_nodes(ours)
        alive = [h for h in ours if h.is_alive()]
        for handle in alive:  # the last output lines first, even when the rank is stuck
            try:
                handle.actor.stop.remote(STOP_FLUSH_S)
            except Exception:
                logger.debug("stop of worker %d failed", handle.index, exc_info=True)
        deadline = time.monotonic() + max(grace_s, STOP_FLUSH_S)
        for handle in alive:
            handle.closed.wait(max(0.0, deadline - time.monotonic()))
        for handle in ours:
            handle.kill()
        _wait_gone(alive, GONE_TIMEOUT_S)
        for handle in ours:
            handle.finish()
        for attempt in list(self._attempts):
            if all(h in ours for h in attempt.handles):
                self._release(attempt)

    def _release(self, attempt: _Attempt) -> None:
        for handle in attempt.handles:
            if handle.is_alive():
                handle.kill()
        if attempt.elastic_bundle is not None:
            self._released = Released.of(attempt.group, attempt.elastic_bundle)
        for group in [attempt.group, *attempt.patches]:
            try:
                remove_placement_group(group)
            except Exception:
                logger.debug("Removing the placement group failed", exc_info=True)
        if attempt in self._attempts:
            self._attempts.remove(attempt)

    def close(self) -> None:
        self._parked = None
        for attempt in list(self._attempts):
            self._release(attempt)
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    # -- diagnostics ----------------------------------------------------------------------------

    def collect_stacks(self, handles: list[WorkerHandle], timeout_s: float) -> dict[int, str]:
        ours = [h for h in handles if isinstance(h, RayWorkerHandle) and h.is_alive()]
        refs = {h.index: h.actor.stacks.remote() for h in ours}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        stacks = {}
        for index, ref in refs.items():
            if ref in ready:
                try:
                    stacks[index] = ray.get(ref)
                except RayActorError:
                    continue
        return stacks

    def notify_preemption(self, handles: list[WorkerHandle], notice: dict[str, Any]) -> None:
        for handle in handles:
            if isinstance(handle, RayWorkerHandle) and handle.is_alive():
                handle.actor.preemption_notice.remote(notice)


def _placement_group(
    spec: WorkerGroupSpec,
    bundle: dict[str, float],
    size: int,
    avoid_nodes: list[str],
    suffix: str = "",
) -> PlacementGroup:
    return placement_group(
        [dict(bundle) for _ in range(size)],
        strategy=spec.scaling_config.placement_strategy,
        name=f"phalanx:{spec.run_name}{suffix}",  # unique among the groups alive at once
        **label_options(spec.scaling_config, size, avoid_nodes),
    )


def _wait_gone(handles: list[RayWorkerHandle], timeout_s: float) -> None:
    """Wait until Ray reports each killed actor dead (a call to it fails)."""
    deadline = time.monotonic() + timeout_s
    pending = list(handles)
    while pending and time.monotonic() < deadline:
        refs = {h.actor.__ray_ready__.remote(): h for h in pending}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0.5)
        pending = [h for ref, h in refs.items() if ref not in ready]
        for ref in ready:
            try:
                ray.get(ref)
                pending.append(refs[ref])  # still answering: the kill has not landed yet
            except RayActorError:
                continue
        if pending:
            time.sleep(0.02)


def run_marker(spec: WorkerGroupSpec) -> tuple[Any, str] | None:
    """(filesystem, path) of the marker file ``RunStorage.prepare()`` wrote in the run directory.

    From ``spec.storage`` when the spec carries it, else from the run's log directory, which is
    ``<run>/logs`` when storage is local (None: nothing to check).
    """
    storage = spec.storage
    if storage is not None:
        return storage.filesystem, storage.path(MARKER_FILE)
    if spec.log_dir is not None and os.path.basename(spec.log_dir) == LOG_DIR:
        return None, os.path.join(os.path.dirname(spec.log_dir), MARKER_FILE)
    return None


def _storage_error(problems: dict[int, tuple[str, str, str]]) -> StorageError:
    detail = "\n".join(
        f"  worker {index} on node {node} ({host}): {why}"
        for index, (host, node, why) in sorted(problems.items())
    )
    return StorageError(
        f"Workers cannot see the run directory that the driver created:\n{detail}\n"
        "Every worker writes its checkpoint parts there, so every node must reach it.\n"
        "HINT: use a filesystem shared by every node (NFS, ...) or a cloud URI such as "
        "s3://bucket/path as RunConfig(storage_path=...)."
    )
