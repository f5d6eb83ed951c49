"""ReportedCheckpoint: a committed checkpoint with the metrics reported with it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from phalanx.checkpoint import Checkpoint

__all__ = ["CheckpointConsistencyMode", "ReportedCheckpoint", "ReportedCheckpointStatus"]


class CheckpointConsistencyMode(enum.Enum):
    """What :func:`phalanx.get_all_reported_checkpoints` waits for.

    ``COMMITTED``: every round this rank reported is processed (its checkpoint, from whichever
    rank passed it, committed). ``VALIDATED``: and every validation requested with
    ``report(validation=...)`` has finished.

    Example::

        reported = phalanx.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED)
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(enum.Enum):
    """``COMMITTED`` (no validation asked), ``PENDING_VALIDATION``, ``VALIDATED``,
    ``VALIDATION_TIMEOUT`` or ``VALIDATION_FAILED``.

    Example::

        for reported in phalanx.get_all_reported_checkpoints():
            if reported.status == ReportedCheckpointStatus.VALIDATED:
                print(reported.checkpoint, reported.metrics)
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A committed checkpoint, rank 0's metrics of its round (with validation metrics merged in
    once validated), and its status.

    Example::

        for reported in phalanx.get_all_reported_checkpoints():
            print(reported.checkpoint.path, reported.metrics["loss"], reported.status)
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus
