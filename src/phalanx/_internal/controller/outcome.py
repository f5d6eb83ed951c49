"""The end of a run: the error to raise for an attempt's failures, and saving it with the run."""

from __future__ import annotations

import logging
import pickle

from phalanx._internal.storage.run_storage import ERROR_PICKLE_FILE, ERROR_TEXT_FILE, RunStorage
from phalanx.errors import (
    PreemptionError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
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
    """The earliest failed rank's own exception, to chain the raised error to."""
    if isinstance(error, WorkerGroupError) and error.worker_failures:
        root = min(error.worker_failures.values(), key=lambda f: (f.time, f.rank))
        return root.exception
    return None
