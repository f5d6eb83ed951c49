"""The end of a run: the error to raise for an attempt's failures, saving it with the run, and
closing the run's storage without hiding that error."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from phalanx._foundation.run_scope import RunStopped
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.run_storage import ERROR_PICKLE_FILE, ERROR_TEXT_FILE, RunStorage
from phalanx.errors import (
    PreemptionError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
    root_failure,
)

logger = logging.getLogger(__name__)


def failure_error(failures: dict[int, WorkerFailure]) -> WorkerGroupError:
    if failures and all(f.kind == "preempted" for f in failures.values()):
        return PreemptionError(failures)
    return WorkerGroupError(failures)


def outcome_name(error: BaseException | None) -> str:
    if error is None:
        return "finished"
    if isinstance(error, WorkerGroupError):
        kinds = {f.kind for f in error.worker_failures.values()}
        return "preempted" if kinds == {"preempted"} else "hang" if "hang" in kinds else "failed"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, RunStopped):  # a callback ended it (a sweep's scheduler)
        return "stopped"
    return "failed"


def save_error(storage: RunStorage, error: BaseException) -> None:
    """``error.txt`` (what ``Result.from_path`` reads) and ``error.pkl`` (loaded only on request).

    A storage too broken to hold them is logged: the run's own error is what the user needs."""
    try:
        storage.write_atomic(ERROR_TEXT_FILE, str(error).encode())
    except StorageError as exc:
        logger.error("The run's error could not be saved with the run: %s", exc)
        return
    try:
        storage.write_atomic(ERROR_PICKLE_FILE, pickle.dumps(error))
    except Exception:
        logger.debug("The error does not pickle; only error.txt is saved.", exc_info=True)


def root_exception(error: TrainingFailedError) -> BaseException | None:
    """The root-cause rank's own exception (``errors.root_failure``), to chain the raised error to."""
    if isinstance(error, WorkerGroupError) and error.worker_failures:
        return root_failure(error.worker_failures).exception
    return None


def close_storage(
    history: MetricsHistory, storage: RunStorage, manager: CheckpointManager, quiet: bool
) -> None:
    """Flush the history, drop uncommitted parts, finish deletions. On the way out of a
    failure (``quiet``) a broken storage is logged, so the error raised is the one that ended
    the run, and what the failure cut off is sorted out (``recover_unindexed``): a checkpoint
    committed but not yet in the index is re-indexed, never deleted."""
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("write the metrics history", history.flush),
        ("compact the metrics history", history.compact),
    ]
    if quiet:  # a commit the failure cut off is re-indexed or set aside, its staged parts go
        steps.append(("sort out uncommitted checkpoints", manager.recover_unindexed))
    else:
        steps.append(("remove uncommitted checkpoint parts", storage.remove_staging))
    steps.append(("finish deleting evicted checkpoints", manager.close))
    for action, step in steps:
        if quiet:
            quietly(action, step)
        else:
            step()


def quietly(action: str, step: Callable[[], Any]) -> None:
    """Run ``step``; a storage error is logged: a run that is failing already raises its own."""
    try:
        step()
    except StorageError as exc:
        logger.error("Could not %s while the run was failing: %s", action, exc)
