"""Run the user's validation function on committed checkpoints, in background threads.

The controller submits a checkpoint when its round commits and collects finished validations
on each poll (so the CheckpointManager is only touched by the controller's thread). A
validation that overruns its ``timeout_s`` is marked ``VALIDATION_TIMEOUT`` and its late result
is ignored; threads cannot be killed, so it finishes on its own (a daemon thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx.checkpoint import Checkpoint
from phalanx.reported_checkpoint import ReportedCheckpointStatus
from phalanx.validation import ValidationConfig, ValidationTaskConfig

if TYPE_CHECKING:
    from phalanx._internal.storage.checkpoint_manager import CheckpointManager
    from phalanx._internal.storage.run_storage import RunStorage

logger = logging.getLogger(__name__)

Apply = Callable[[str, dict[str, Any], str], None]


@dataclass
class _Running:
    dir_name: str
    started: float
    timeout_s: float | None
    done: threading.Event = field(default_factory=threading.Event)
    metrics: dict[str, Any] = field(default_factory=dict)
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.VALIDATED


class Validations:
    def __init__(self, config: ValidationConfig | None) -> None:
        self.config = config
        self._running: list[_Running] = []

    def submit(
        self, dir_name: str, checkpoint: Checkpoint, task: bool | ValidationTaskConfig
    ) -> None:
        assert self.config is not None
        settings = self.config.merged(task)
        running = _Running(dir_name, time.monotonic(), settings.timeout_s)
        fn = self.config.fn
        thread = threading.Thread(
            target=_validate,
            args=(fn, checkpoint, settings.fn_kwargs, running),
            name="phalanx-validation",
            daemon=True,
        )
        self._running.append(running)
        thread.start()

    def collect(self, apply: Apply, wait: bool = False) -> None:
        """Apply every finished (or timed-out) validation; with ``wait``, wait for all."""
        still = []
        for running in self._running:
            left = _time_left(running)
            if wait:
                running.done.wait(left)
            if running.done.is_set():
                apply(running.dir_name, running.metrics, running.status.value)
            elif _time_left(running) == 0:
                logger.warning(
                    "Validation of %s took longer than timeout_s=%s; its result is ignored.",
                    running.dir_name,
                    running.timeout_s,
                )
                apply(running.dir_name, {}, ReportedCheckpointStatus.VALIDATION_TIMEOUT.value)
            else:
                still.append(running)
        self._running = still


def _time_left(running: _Running) -> float | None:
    if running.timeout_s is None:
        return None
    return max(0.0, running.started + running.timeout_s - time.monotonic())


def _validate(
    fn: Callable[..., object],
    checkpoint: Checkpoint,
    kwargs: Mapping[str, object],
    running: _Running,
) -> None:
    try:
        metrics = fn(checkpoint, **kwargs)
        if not isinstance(metrics, dict):
            raise TypeError(
                f"the validation function returned {type(metrics).__name__}; it must return a "
                "dict of metrics"
            )
        running.metrics = metrics
    except Exception:
        logger.exception("Validation of %s failed", running.dir_name)
        running.status = ReportedCheckpointStatus.VALIDATION_FAILED
    finally:
        running.done.set()


def resume_unfinished(
    validations: Validations, manager: CheckpointManager, storage: RunStorage
) -> None:
    """Validations a previous run of this name left unfinished run again (with the trainer's
    default settings: a report's own fn_kwargs are not stored)."""
    for dir_name in manager.pending_validations():
        checkpoint = Checkpoint(storage.checkpoint_path(dir_name), storage.filesystem)
        if validations.config is not None:
            logger.warning("Validating %s again: its validation did not finish.", dir_name)
            validations.submit(dir_name, checkpoint, True)
        else:
            logger.warning(
                "%s was never validated and this trainer has no validation_config.", dir_name
            )
            manager.update_validation(dir_name, {}, "VALIDATION_FAILED")
