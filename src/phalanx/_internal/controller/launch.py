"""Starting one attempt: the worker group's blueprint, each rank's session, the framework's
setup and the training call. Plain functions of what the controller hands them."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from phalanx._internal.controller.rounds import ReportRounds
from phalanx._internal.controller.spec import RunSpec
from phalanx._internal.engines.base import Engine, WorkerGroupSpec
from phalanx._internal.engines.messages import CallDone, Events
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.data_position import Record, build_record, dataset_records
from phalanx._internal.worker.session import SessionSpec, run_train_fn
from phalanx._internal.worker.storage_context import StorageContext
from phalanx._internal.worker_group.group import WorkerGroup
from phalanx.backend import Backend
from phalanx.checkpoint import Checkpoint
from phalanx.context import TrainContext

logger = logging.getLogger(__name__)


def group_spec(spec: RunSpec, storage: RunStorage, attempt_index: int) -> WorkerGroupSpec:
    runtime_env = spec.run_config.worker_runtime_env or {}
    scaling = spec.scaling_config
    return WorkerGroupSpec(
        max(1, scaling.max_workers),  # 0: one worker in the driver's thread
        scaling,
        spec.run_name,
        storage.local_log_dir(),
        start_timeout_s=spec.start_timeout_s,
        attempt=attempt_index,
        preload_modules=_preload_modules(spec),
        storage=storage,
        env=dict(runtime_env.get("env_vars") or {}),
        runtime_env=dict(runtime_env),
        min_workers=scaling.min_workers if scaling.elasticity_enabled else None,
        reset_worker=_reset_worker(spec.backend_config.backend_cls),
        abort_worker=getattr(spec.backend_config.backend_cls, "abort_worker", None),
    )


def _reset_worker(backend_cls: type[Backend]) -> Callable[[], None] | None:
    """What makes a worker reusable after a failed attempt: the backend's ``reset_worker``; a
    run without a framework (the plain Backend) has nothing to reset."""
    if backend_cls is Backend:
        return _nothing_to_reset
    return backend_cls.reset_worker


def _nothing_to_reset() -> None:
    pass


def _preload_modules(spec: RunSpec) -> tuple[str, ...]:
    """What the fork server imports while this group runs, for the workers of a restart. Only a
    run that may restart after a failure (``max_failures != 0``) pays for it: the import costs
    the machine seconds of CPU (``torch._dynamo``: over a second) and saves as much per restarted
    worker. Without it, a restart after a preemption imports in the new workers, as Ray Train's
    and torchrun's do."""
    if spec.run_config.failure_config.max_failures == 0:
        return ()
    return spec.backend_config.preload_modules


def session_specs(
    spec: RunSpec,
    storage: RunStorage,
    group: WorkerGroup,
    checkpoint: Checkpoint | None,
    next_round: int,
    attempt_index: int,
    data_record: dict[str, Any] | None = None,
    peer: tuple[int, Record] | None = None,
) -> list[SessionSpec]:
    """Each rank's session: its context, the checkpoint to resume from, its dataset shards.
    ``data_record``: the data positions stored with ``checkpoint`` (None: the data starts
    afresh; empty: the checkpoint stored none). ``peer``: the round the ranks may recover to
    from the survivors' state and the data positions at it (``peer_record``): each rank also
    gets the shards that continue there, for ``phalanx.torch._peer`` to switch to."""
    if data_record is None:
        shards = spec.make_shards(len(group))
    else:
        shards = spec.make_shards(len(group), resume=dataset_records(data_record))
    peer_shards = shards
    if peer is not None and peer[0] >= next_round:  # else the checkpoint's round: same shards
        peer_shards = spec.make_shards(len(group), resume=dataset_records(peer[1]), peer=peer[0])
    specs = []
    for worker in group.workers:
        r = worker.ranks
        context = TrainContext(
            r.world_rank,
            len(group),
            r.local_rank,
            r.local_world_size,
            r.node_rank,
            spec.run_name,
            StorageContext.of(storage),
            spec.metadata,
            worker.metadata.gpu_ids,
            attempt_index,
        )
        specs.append(
            SessionSpec(
                context,
                storage,
                checkpoint,
                next_round,
                attempt_index,
                shards[worker.world_rank],
                has_validation=spec.validation_config is not None,
                data_record=data_record or None,
                peer_shards=(peer[0], peer_shards[worker.world_rank]) if peer else None,
            )
        )
    return specs


def peer_record(spec: RunSpec, rounds: ReportRounds) -> tuple[int, Record] | None:
    """For a run that reads phalanx datasets: the failed attempt's last complete round (the
    step every rank completed, which recovery from the survivors' state resumes after) and the
    data positions at it, combined over the failed attempt's shards (call it before the new
    attempt's are made). None: the run has no such datasets, or no position of that round."""
    last = rounds.previous_complete()
    if not spec.dataset_names or not spec.resume_data_position or last is None:
        return None
    index, positions = last
    if len(positions) < 2 or any(p is None for p in positions):  # 1 rank: nobody to recover from
        return None
    try:
        record = build_record(positions, spec.dataset_positions.combine)
    except Exception:  # the checkpoint's positions still hold: resume from there
        logger.warning(
            "Could not combine the ranks' data positions of round %d: the run resumes from the "
            "last committed checkpoint, not the failed step.\nHINT: report this as a phalanx "
            "bug with the traceback below.",
            index,
            exc_info=True,
        )
        return None
    if set(dataset_records(record)) != set(spec.dataset_names):  # a ray.data.Dataset: no position
        return None
    return index, record


def prepare_workers(engine: Engine, group: WorkerGroup, spec: RunSpec, backend: Backend) -> None:
    """The framework's setup (a process group, ...) and the runtime env's working_dir; none
    for a function running in the driver's thread, which has no peers."""
    if engine.in_process:
        return
    working_dir = (spec.run_config.worker_runtime_env or {}).get("working_dir")
    if working_dir and engine.applies_runtime_env:  # Ray's runtime_env does it on Ray
        group.execute(os.chdir, os.path.abspath(working_dir))
    backend.on_start(group, spec.backend_config)
    backend.on_training_start(group, spec.backend_config)


def start_training(engine: Engine, group: WorkerGroup, spec: RunSpec) -> list[Future[object]]:
    """The training call on every rank; each wakes the controller's poll as it resolves."""
    in_process = engine.in_process
    futures = group.execute_async(
        run_train_fn,
        spec.train_fn if in_process and spec.train_fn is not None else spec.train_fn_payload,
        spec.train_loop_config,
        contextlib.nullcontext if in_process else spec.backend_config.train_func_context,
    )
    for worker, future in zip(group.workers, futures, strict=True):
        future.add_done_callback(_wake_on_done(group.events, worker.handle.index))
    return futures


def _wake_on_done(events: Events, index: int) -> Callable[[Future[object]], None]:
    """Wake the poll loop as soon as a rank's training call resolves."""
    return lambda _future: events.put((index, CallDone()))
