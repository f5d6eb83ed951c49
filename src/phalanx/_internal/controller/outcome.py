"""The end of an attempt and of the run: the error to raise for an attempt's failures, how each
attempt ended in the run's record, the run's last bookkeeping and the Result it returns, saving
its error with the run, and closing the run's storage without hiding that error."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from phalanx._foundation.goodput_parts import Goodput
from phalanx._foundation.run_scope import RunStopped
from phalanx._internal.controller.stragglers import StragglerPeriod
from phalanx._internal.controller.validation import Validations
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.reader import RunReader
from phalanx._internal.storage.run_storage import ERROR_PICKLE_FILE, ERROR_TEXT_FILE, RunStorage
from phalanx.errors import (
    PreemptionError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
    root_failure,
)
from phalanx.result import Result, attempt_errors

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


def end_attempt(manager: CheckpointManager, error: BaseException | None) -> None:
    """Record in the run's snapshot how the attempt ended (``error``: None when it finished)."""
    manager.end_attempt(outcome_name(error), str(error)[:2000] if error else None)


def record_end(manager: CheckpointManager, validations: Validations, finished: bool) -> None:
    """The run's last bookkeeping: the end of a finished run's last attempt (a failed one was
    recorded as it failed), the validations still running, the snapshot. The end of a failed
    run only logs a storage error: the run's own error matters more than a storage too broken
    to record it."""
    collect = partial(validations.collect, manager.update_validation, wait=True)
    if finished:
        end_attempt(manager, None)
        collect()
        manager.save()
    else:
        quietly("record the validations", collect)
        quietly("save the run's snapshot", manager.save)


def run_result(
    manager: CheckpointManager,
    storage: RunStorage,
    metrics: dict[str, Any] | None,
    error: TrainingFailedError | None,
    return_value: object,
    stragglers: Iterable[StragglerPeriod],
    goodput: Goodput,
) -> Result:
    """The Result ``fit()`` returns (or attaches to the error it raises)."""
    return Result(
        metrics=metrics,
        checkpoint=manager.latest_checkpoint,
        error=error,
        path=storage.run_uri,
        best_checkpoints=manager.best_checkpoints(),
        return_value=return_value,
        attempts=manager.attempts,
        attempt_errors=attempt_errors(manager.attempt_history),
        stragglers=[dict(period) for period in stragglers],
        goodput=goodput,
        _storage=RunReader(storage),
    )


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
    steps: list[tuple[str, Callable[[], object]]] = [
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


def quietly(action: str, step: Callable[[], object]) -> None:
    """Run ``step``; a storage error is logged: a run that is failing already raises its own."""
    try:
        step()
    except StorageError as exc:
        logger.error("Could not %s while the run was failing: %s", action, exc)
