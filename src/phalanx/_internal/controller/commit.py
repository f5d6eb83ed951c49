"""A complete round made durable: its row in the metrics history and, when its ranks saved one,
its checkpoint, committed with the data positions the ranks reported in that round; the record
of which rounds are processed (ranks read it); and the data positions an attempt resumes from.

The controller decides *when* a round is complete and who hears of it (callbacks, the progress
view); this module decides *what* is written for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx._internal.controller.goodput import GoodputClock
from phalanx._internal.controller.outcome import quietly
from phalanx._internal.controller.progress import RunWatcher
from phalanx._internal.controller.resume import log_data_resume
from phalanx._internal.controller.rounds import Round
from phalanx._internal.controller.spec import RunSpec
from phalanx._internal.controller.validation import Validations
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.commit_record import CommitRecord
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.data_position import (
    CHECKPOINT_FILE,
    build_record,
    dataset_records,
    encode_record,
    read_record,
)
from phalanx.checkpoint import Checkpoint
from phalanx.errors import ControllerError

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # one per run: compared by identity
class RoundCommitter:
    """Writes what each complete round leaves behind. One per run; ``validation_requests`` and
    the awaited rounds are filled by the controller as the ranks' events arrive."""

    spec: RunSpec
    storage: RunStorage
    manager: CheckpointManager
    history: MetricsHistory
    goodput: GoodputClock
    validations: Validations
    watcher: RunWatcher  # shows where the data stands
    # round -> report(validation=...)
    validation_requests: dict[int, Any] = field(default_factory=dict, init=False)
    # get_all_reported_checkpoints waits for these
    awaited_rounds: set[int] = field(default_factory=set, init=False)

    def check(self, round_: Round) -> str | None:
        """The round's checkpoint directory (None: no checkpoint), before anything is written:
        a config error found here commits nothing."""
        names = round_.checkpoint_dir_names
        if len(names) > 1:
            raise ControllerError(
                f"Ranks reported different checkpoint_dir_name values in round {round_.index}: "
                f"{sorted(names)}. HINT: pass the same checkpoint_dir_name on every rank."
            )
        dir_name = next(iter(names), None)
        if dir_name is not None and round_.index not in self.validation_requests:
            self.manager.check_score(dir_name, round_.run_metrics)
        return dir_name

    def commit(self, round_: Round, dir_name: str | None, attempt_index: int) -> Checkpoint | None:
        """Record the round checked by ``check``; returns the latest checkpoint when the round
        committed one, else None."""
        metrics = round_.run_metrics
        self.manager.next_round = round_.index + 1
        self.history.add_round(round_.index, metrics, dir_name)
        checkpoint, commit_s = None, None
        if dir_name is not None:
            committing = time.perf_counter()
            record = CommitRecord(
                dir_name, round_.index, attempt_index, metrics, round_.checkpoint_class
            )
            final = self.storage.commit(
                dir_name, attempt_index, self.spec.metadata, self.checkpoint_files(round_), record
            )
            commit_s = time.perf_counter() - committing
            self.goodput.checkpoint_committed(self.storage.filesystem, final)
            self.history.flush()
            validation = self.validation_requests.pop(round_.index, None)
            tracked = TrackedCheckpoint(dir_name, metrics, round_.index, round_.checkpoint_class)
            self.manager.register(tracked, pending_validation=validation is not None)
            checkpoint = self.manager.latest_checkpoint
            if validation is not None and checkpoint is not None:
                self.validations.submit(dir_name, checkpoint, validation)
        self.goodput.round_committed(round_, commit_s)
        return checkpoint

    def checkpoint_files(self, round_: Round) -> dict[str, bytes]:
        """The trainer's files for every checkpoint, plus the round's data positions."""
        try:
            record = build_record(round_.positions or [], self.spec.dataset_positions.combine)
        except Exception:  # the checkpoint matters more than where its data stood
            logger.warning(
                "Could not combine the ranks' data positions of round %d: its checkpoint is "
                "committed without them, and a resume from it starts each epoch over.\nHINT: "
                "report this as a phalanx bug with the traceback below.",
                round_.index,
                exc_info=True,
            )
            record = {}
        if not record:
            return self.spec.checkpoint_files
        self.show_data(record)
        return {**self.spec.checkpoint_files, CHECKPOINT_FILE: encode_record(record)}

    def resume_record(self, checkpoint: Checkpoint | None) -> dict[str, Any] | None:
        """The data positions the attempt resumes from: those stored with ``checkpoint`` ({}
        when it has none), or None for a fresh start (no checkpoint, or resume_position=False)."""
        if checkpoint is None or not self.spec.resume_data_position:
            return None
        record = read_record(checkpoint) or {}
        log_data_resume(record, self.spec.dataset_positions)
        self.show_data(record)
        return record

    def show_data(self, record: Mapping[str, object]) -> None:
        positions = self.spec.dataset_positions
        shown = [positions.progress(n, r) for n, r in dataset_records(record).items()]
        self.watcher.data = ", ".join(shown)

    def record_awaited_rounds(self) -> None:
        """Rounds without a checkpoint write no snapshot: record that the rounds a rank waits for
        in get_all_reported_checkpoints are processed, once they are."""
        done = {r for r in self.awaited_rounds if r <= self.manager.next_round}
        if done:
            self.awaited_rounds -= done
            self.manager.record_next_round()

    def discard_uncommitted(self) -> None:
        """After an attempt ends early: the checkpoint parts and checkpoints it did not commit."""
        quietly("sort out uncommitted checkpoints", self.manager.recover_unindexed)
