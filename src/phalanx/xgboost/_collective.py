"""Inside each worker: XGBoost's tracker (rank 0) and joining the group around the training
function. The backend (on the driver) calls :func:`start_tracker` and :func:`prepare_rank` on
every rank; :class:`CollectiveContext` wraps the training function.

The tracker lives in rank 0's process rather than the driver's: when an attempt fails, killing
the workers also ends the tracker, and nothing waits on a group that will never finish.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import phalanx.session as session
from phalanx._gbdt.threads import cpu_share, default_threads

__all__ = ["CollectiveContext", "prepare_rank", "start_tracker", "stop_tracker"]

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from xgboost.tracker import RabitTracker

# What a worker needs to reach the tracker (its address, the group size, this rank's task id).
TrackerArgs = dict[str, str | int]


@dataclass
class _GroupState:
    """This process's part of the group: set by the backend's calls, taken by
    CollectiveContext (and stop_tracker), once each."""

    tracker: RabitTracker | None = None
    args: TrackerArgs | None = None
    threads: int | None = None


_state = _GroupState()


def start_tracker(num_workers: int, host: str) -> TrackerArgs | None:
    """On rank 0: start the tracker on ``host`` and return what workers need to reach it."""
    if session.get_context().get_world_rank() != 0:
        return None
    from xgboost.tracker import RabitTracker

    # sortby="task": ranks follow the task ids given in prepare_rank, i.e. phalanx's ranks.
    tracker = RabitTracker(n_workers=num_workers, host_ip=host, sortby="task")
    tracker.start()
    _state.tracker = tracker
    return dict(tracker.worker_args())


def prepare_rank(tracker_args: TrackerArgs | None, cpus_per_worker: float | None) -> None:
    """On every rank: remember how to join the group (None: train alone) and the thread share."""
    context = session.get_context()
    if tracker_args is not None:
        rank = context.get_world_rank()
        tracker_args = {**tracker_args, "dmlc_task_id": f"phalanx-rank-{rank:08d}"}
    _state.args = tracker_args
    _state.threads = cpu_share(cpus_per_worker, context.get_local_world_size())


def stop_tracker(timeout_s: float) -> None:
    """On rank 0, after training: wait for the tracker to see every worker leave, free it."""
    tracker, _state.tracker = _state.tracker, None
    if tracker is None:
        return
    # Not freed when the wait times out: freeing waits for the tracker's thread to end.
    tracker.wait_for(int(max(1, timeout_s)))
    tracker.free()


class CollectiveContext:
    """Wraps the training function on every rank: joins XGBoost's communication group (when
    there is one) and sets the default thread count; leaves the group afterwards."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> CollectiveContext:
        args, _state.args = _state.args, None
        threads, _state.threads = _state.threads, None
        if threads:
            self._stack.enter_context(default_threads(threads))
        if args is not None:
            from xgboost.collective import CommunicatorContext

            self._stack.enter_context(CommunicatorContext(**args))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()
