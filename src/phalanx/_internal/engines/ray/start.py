"""Starting a launch's Ray actors: each worker's actor in its bundle of a placement group, and the
``hello`` each answers once its process runs (host, node, pid, GPUs, and whether it sees the
run directory that the driver created).

:class:`ActorStarter` holds what every actor of one launch shares (the spec, the bundle, the
events queue, the drain thread), so a first launch and an in-place relaunch (``relaunch``)
start actors the same way.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from phalanx._internal.engines.base import WorkerGroupSpec, WorkerMetadata
from phalanx._internal.engines.messages import Events
from phalanx._internal.engines.ray.actor import PhalanxWorker
from phalanx._internal.engines.ray.drain import DrainPoller
from phalanx._internal.engines.ray.handle import RayWorkerHandle
from phalanx._internal.engines.ray.placement import actor_options, label_options
from phalanx._internal.storage.run_storage import LOG_DIR, MARKER_FILE
from phalanx.errors import StorageError, WorkerStartupError

ACTOR_CONCURRENCY = 8  # calls, drain, stop, stacks... answered while a training call runs

_RemoteWorker = ray.remote(PhalanxWorker)

START_HINT = (
    "check the Ray logs of those actors (ray logs, or /tmp/ray/session_latest/logs); raise "
    "PHALANX_WORKER_START_TIMEOUT_S if starting is only slow. The attempt is retried under "
    "FailureConfig(max_failures=...)."
)


@dataclass(frozen=True)
class ActorStarter:
    """Starts the actors of one launch of ``spec``: bundles of ``bundle``, messages to
    ``events``, every actor drained by ``poller``."""

    poller: DrainPoller
    spec: WorkerGroupSpec
    bundle: dict[str, float]
    events: Events

    def placement_group(
        self, size: int, avoid_nodes: list[str], suffix: str = ""
    ) -> PlacementGroup:
        """A new group of ``size`` bundles off ``avoid_nodes`` (``suffix``: one more group of
        the same run, alive at once with the first)."""
        scaling = self.spec.scaling_config
        return placement_group(
            [dict(self.bundle) for _ in range(size)],
            strategy=scaling.placement_strategy,
            name=f"phalanx:{self.spec.run_name}{suffix}",  # unique among the groups alive at once
            **label_options(scaling, size, avoid_nodes),
        )

    def start(
        self, group: PlacementGroup, index: int, bundle_index: int | None = None
    ) -> RayWorkerHandle:
        """Worker ``index``'s actor in bundle ``bundle_index`` (default: ``index``) of ``group``."""
        spec = self.spec
        bundle_index = index if bundle_index is None else bundle_index
        actor = _RemoteWorker.options(  # type: ignore[attr-defined]
            **actor_options(self.bundle),
            max_concurrency=ACTOR_CONCURRENCY,
            max_restarts=0,
            **({"runtime_env": dict(spec.runtime_env)} if spec.runtime_env else {}),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=bundle_index
            ),
        ).remote(dict(spec.env), driver_sys_path())
        handle = RayWorkerHandle(index, actor, self.events, spec.log_dir, spec.attempt)
        handle.placement = (group, bundle_index)
        self.poller.add(handle)  # so output printed while starting reaches the driver
        return handle

    def send_hellos(self, handles: list[RayWorkerHandle]) -> list[Any]:
        """Ask each actor for its ``hello``; Ray delivers it once the actor runs."""
        marker = run_marker(self.spec)
        return [h.actor.hello.remote(marker) for h in handles]

    def await_hellos(self, handles: list[RayWorkerHandle], refs: list[Any]) -> None:
        """Wait for every actor's ``hello`` (sent at creation), counted from the group's
        placement; fills each handle's metadata."""
        timeout_s = self.spec.start_timeout_s
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        late = [h.index for h, ref in zip(handles, refs, strict=True) if ref not in ready]
        if late:
            why = (
                f"no hello within {timeout_s:g} s (the placement group was ready, "
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

    def greet(self, handles: list[RayWorkerHandle]) -> None:
        """Send the hellos of actors placed already and wait for them."""
        if handles:
            self.await_hellos(handles, self.send_hellos(handles))


def driver_sys_path() -> list[str]:
    """The driver's import path as absolute directories ('' is the driver's working directory)."""
    return [os.path.abspath(p or os.curdir) for p in sys.path]


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
