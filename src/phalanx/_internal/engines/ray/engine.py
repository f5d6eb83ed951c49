"""RayEngine: workers are Ray actors, one per worker, inside one placement group per attempt.

Only Ray Core is used (actors, placement groups). The placement group has one bundle per worker,
``resources_per_worker`` (Ray Train's defaults), placed with ``placement_strategy``. A request
the cluster can never satisfy fails at once (:meth:`RayEngine.check`); one that needs resources
that are busy now waits, and logs every few seconds that it waits and for what.

What runs in each actor is in ``actor``; the driver's side of an actor and the thread that
drains every actor's messages are in ``handle``; starting a launch's actors and awaiting their
hellos is ``start``. In-place recovery keeps a failed attempt's survivors (``reuse``, through
:meth:`RayEngine.park`) and starts the next attempt around them (``relaunch``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any, NoReturn

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, remove_placement_group

from phalanx._foundation import env
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle
from phalanx._internal.engines.messages import Events
from phalanx._internal.engines.ray import gcs
from phalanx._internal.engines.ray.drain import DrainPoller
from phalanx._internal.engines.ray.elastic_placement import Released, place_elastic, placeable_now
from phalanx._internal.engines.ray.handle import RayWorkerHandle
from phalanx._internal.engines.ray.placement import (
    _fmt,
    infeasibility,
    visible_resources,
    worker_bundle,
)
from phalanx._internal.engines.ray.relaunch import prestart, relaunch, relaunch_elastic
from phalanx._internal.engines.ray.reuse import (
    Attempt,
    Parked,
    can_park,
    log_reuse,
    reset_survivors,
    usable_bundles,
)
from phalanx._internal.engines.ray.start import START_HINT, ActorStarter
from phalanx.config import ScalingConfig
from phalanx.errors import (
    ConfigError,
    RayClusterUnresponsiveError,
    StorageError,
    WorkerStartupError,
)

logger = logging.getLogger(__name__)

WAIT_LOG_EVERY_S = 10.0  # how often a placement that waits for resources says so
STOP_FLUSH_S = 0.5  # how long a stopping worker gets to send its last output lines
GONE_TIMEOUT_S = 5.0
# A node whose actors were lost with it (unreachable) still looks alive, its resources free, until
# the GCS declares it dead (~30 s with Ray's default health checks): placements keep off it this
# long, so a restart neither waits on it nor sizes an elastic group by its phantom capacity. A
# node that was only cut off for a while is used again after.
AVOID_LOST_NODE_S = 120.0


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


def alive_node_resources() -> list[dict[str, float]]:
    return [visible_resources(n["Resources"]) for n in gcs.nodes() if n.get("Alive")]


class RayEngine(Engine):
    """Workers as Ray actors. Connects to Ray (or starts it) at the first ``check``/``launch``."""

    name = "ray"
    process_per_worker = True
    sizes_elastic_groups = True

    def __init__(self) -> None:
        self._poller: DrainPoller | None = None
        self._attempts: list[Attempt] = []
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
            avoid = self._avoid_nodes()
            idle = usable_bundles([p for a in self._attempts for p in a.idle], avoid)
            return placeable_now(bundle, 0, most, avoid) + len(idle)
        except RayClusterUnresponsiveError as exc:  # no growth now; the run itself goes on
            logger.warning("Not resizing the worker group now: %s", exc)
            return 0

    # -- launch ---------------------------------------------------------------------------------

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        if self._poller is None:
            self._poller = DrainPoller()
        bundle = worker_bundle(spec.scaling_config)
        starter = ActorStarter(self._poller, spec, bundle, events)
        parked, self._parked = self._parked, None
        if parked is not None:  # placed already: a new node may still be on its way
            parked.attempt.starter = starter
            handles = self._relaunch(parked, starter)
            if handles is not None:
                logger.debug("relaunch: every actor said hello")
                return handles
            self._release(parked.attempt)
        if spec.min_workers is None:  # elastic: checked at fit(); a lost node may come back
            self.check(spec.scaling_config)
        avoid = self._avoid_nodes()
        if avoid:
            logger.info("Placing the workers off the node(s) lost last attempt: %s", avoid)
        elastic = spec.min_workers is not None
        if elastic:
            make_group = partial(starter.placement_group, avoid_nodes=avoid)
            group, size = place_elastic(
                spec, bundle, make_group, WAIT_LOG_EVERY_S, avoid, self._released
            )
            spec = replace(spec, num_workers=size)
            starter = replace(starter, spec=spec)
        else:
            group = starter.placement_group(spec.num_workers, avoid)
        reset = None if env.restore_mode() == "full" else spec.reset_worker
        attempt = Attempt(
            group, [], bundle if elastic else None, reset, starter=starter, abort=spec.abort_worker
        )
        self._attempts.append(attempt)
        try:
            # The actors and their hellos go out before the group is placed: Ray queues them
            # and starts each worker process the moment its bundle is committed, without a
            # round trip through the driver (the group's creation overlaps the actors').
            attempt.handles = [starter.start(group, index) for index in range(spec.num_workers)]
            hellos = starter.send_hellos(attempt.handles)
            self._wait_for_placement(group, spec, bundle)
            starter.await_hellos(attempt.handles, hellos)
        except BaseException as exc:
            self._start_failed(attempt, spec, exc)
        return list(attempt.handles)

    def _relaunch(self, parked: Parked, starter: ActorStarter) -> list[WorkerHandle] | None:
        """The next attempt in the parked group (module ``relaunch``); None: place it afresh
        (a fixed-size group of another size, an elastic one below min_workers)."""
        spec = starter.spec
        same_size = spec.num_workers == len(parked.kept) + len(parked.lost)
        if spec.min_workers is None and not same_size:
            return None
        try:
            if spec.min_workers is None:
                return list(relaunch(parked, starter, self._avoid_nodes()))
            handles = relaunch_elastic(parked, starter, self._avoid_nodes())
            return None if handles is None else list(handles)
        except BaseException as exc:
            self._start_failed(parked.attempt, spec, exc)

    def _start_failed(
        self, attempt: Attempt, spec: WorkerGroupSpec, exc: BaseException
    ) -> NoReturn:
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
        early = self._prestart(attempt, [h for h in ours if not h.is_alive()])
        logger.debug("park: ending the training calls of %d actor(s)", len(ours))
        kept, why = reset_survivors(ours, attempt.reset_worker, env.reuse_stop_s(), attempt.abort)
        logger.debug("park: %d actor(s) reset and kept", len(kept))
        log_reuse(kept, len(ours), why)
        gone = [h for h in ours if h not in kept]
        for handle in gone:
            handle.kill()
        _wait_gone([h for h in gone if h.is_alive()], GONE_TIMEOUT_S)
        for handle in gone:
            handle.finish()
        if kept:
            by_index = {h.index: h for h in kept}
            self._parked = Parked(attempt, by_index, {h.index: h for h in gone}, early)
        else:
            self._release(attempt)

    def _prestart(
        self, attempt: Attempt, dead: list[RayWorkerHandle]
    ) -> dict[int, tuple[RayWorkerHandle, Any]]:
        """New actors for the dead workers, started before the survivors are reset (module
        ``relaunch``); each is one of the attempt's handles until the relaunch takes it, so a
        release kills it. A failure to start them is left to the relaunch.

        Only where the group spans machines: on one machine (a fake multi-node cluster) both
        compete for the same cores, and starting them first makes the restart slower.
        PHALANX_RESTORE_PRESTART=on|off overrides it."""
        wanted = env.restore_prestart()
        one_machine = len({h.metadata.host for h in attempt.handles}) < 2
        if wanted == "off" or (wanted == "auto" and one_machine):
            return {}
        try:
            early = prestart(attempt, dead, self._avoid_nodes())
        except Exception:
            logger.debug("Starting the new actors at park failed", exc_info=True)
            return {}
        attempt.handles = [*attempt.handles, *(handle for handle, _ in early.values())]
        return early

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

    def _release(self, attempt: Attempt) -> None:
        for handle in attempt.handles:
            if handle.is_alive():
                handle.kill()
        if attempt.elastic_bundle is not None:
            groups = [attempt.group, *attempt.patches]
            self._released = Released.of(groups, attempt.elastic_bundle)
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
