"""The lines fit() logs when it continues an existing run (same name and storage_path) and when
an attempt resumes its data mid-epoch."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from phalanx._internal.controller.spec import DatasetPositions
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.worker.data_position import dataset_records

logger = logging.getLogger(__name__)

OUTCOMES = {
    None: "was cut off (its driver stopped)",
    "finished": "finished",
    "failed": "failed",
    "hang": "hung",
    "preempted": "was preempted",
    "interrupted": "was interrupted",
}


def log_resume(run_name: str, manager: CheckpointManager) -> None:
    """``Resuming run 'exp' from checkpoint_000009; the previous attempt finished.``"""
    previous = manager.attempt_history[-1] if manager.attempt_history else {}
    outcome = previous.get("outcome")
    start = (
        f"from {manager.latest.dir_name}"
        if manager.latest is not None
        else "from the beginning (it has no checkpoint)"
    )
    before = (
        f"the previous attempt {OUTCOMES.get(outcome, str(outcome))}"
        if previous
        else "its index was rebuilt from the checkpoints' commit records"
    )
    logger.warning(
        "Resuming run %r %s; %s. HINT: set RunConfig(name=...) to a new name to start a fresh run.",
        run_name,
        start,
        before,
    )


def log_data_resume(record: Mapping[str, object], positions: DatasetPositions) -> None:
    """``Resuming data from the checkpoint: dataset 'train' at epoch 3, sample 91,200 of
    120,000.`` when the checkpoint an attempt starts from stored dataset positions."""
    described = [positions.describe(name, rec) for name, rec in dataset_records(record).items()]
    if described:
        logger.warning("Resuming data from the checkpoint: %s.", "; ".join(described))
