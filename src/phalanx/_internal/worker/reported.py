"""``get_all_reported_checkpoints()``: read the run's snapshot until every round this rank has
reported is processed, as Ray's "blocks until Ray Train has finished processing every in-flight
report call".

The driver writes the snapshot (or its journal) after every commit and every finished
validation, so any rank on any engine can read it from the run's storage. A round that carried
no checkpoint writes nothing: a rank waiting for one asks the driver (a ``("poll", round)``
message) to record it once it is processed. So a rank that reported without a checkpoint, while
another rank passed one in the same round, sees that checkpoint.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.storage.snapshot_journal import read_state
from phalanx.checkpoint import Checkpoint
from phalanx.reported_checkpoint import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)

if TYPE_CHECKING:
    from phalanx._internal.worker.session import Session

logger = logging.getLogger(__name__)

POLL_S = 0.02
PENDING = ReportedCheckpointStatus.PENDING_VALIDATION.value


def reported_checkpoints(
    session: Session, mode: CheckpointConsistencyMode, timeout_s: float | None
) -> list[ReportedCheckpoint]:
    """Wait until the snapshot has processed every round this rank reported; then list them."""
    session.finish_uploads()  # ASYNC parts are reported only once they are stored
    wanted = session.next_round  # the snapshot's next_round once all of them are processed
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    asked = False
    while True:
        state = _read_snapshot(session.storage)
        statuses = state.get("statuses", {})
        processed = int(state.get("next_round", 0)) >= wanted
        pending = mode is CheckpointConsistencyMode.VALIDATED and PENDING in statuses.values()
        if processed and not pending:
            return [_reported(session.storage, c, statuses) for c in state.get("checkpoints", [])]
        if deadline is not None and time.monotonic() > deadline:
            # As Ray: the list as it stands, not an error (a loop that asks with a timeout
            # keeps training); a warning, not Ray's DEBUG line, says what it lacks.
            logger.warning(
                "get_all_reported_checkpoints(timeout_s=%s) timed out: %s The list returned may "
                "lack those checkpoints.",
                timeout_s,
                "validations are still running."
                if processed
                else f"the rounds this rank reported (up to round {wanted - 1}) are not all "
                "processed yet: other ranks have not reported them, or their checkpoint parts "
                "are still being saved.",
            )
            return [_reported(session.storage, c, statuses) for c in state.get("checkpoints", [])]
        if pending or not asked:
            session.nudge_driver(None if processed else wanted)
            asked = asked or not processed
        time.sleep(POLL_S)


def _read_snapshot(storage: RunStorage) -> dict[str, Any]:
    try:
        state = read_state(storage)  # the snapshot with the journal of recent commits
    except (ValueError, KeyError, TypeError):  # mid-write on a store without atomic replace
        return {}
    return state if isinstance(state, dict) else {}


def _reported(
    storage: RunStorage, entry: dict[str, Any], statuses: dict[str, str]
) -> ReportedCheckpoint:
    name = entry["dir_name"]
    status = ReportedCheckpointStatus(statuses.get(name, ReportedCheckpointStatus.COMMITTED.value))
    checkpoint = Checkpoint(storage.checkpoint_path(name), storage.filesystem)
    return ReportedCheckpoint(checkpoint, dict(entry["metrics"]), status)
