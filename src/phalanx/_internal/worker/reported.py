"""``get_all_reported_checkpoints()``: read the run's snapshot until this rank's checkpoints
are in it.

The driver writes the snapshot (or its journal) after every commit and every finished validation, so any rank on
any engine can read it from the run's storage, with no extra channel to the driver.
"""

from __future__ import annotations

import time
from typing import Any

from phalanx._internal.storage.snapshot_journal import read_state
from phalanx.checkpoint import Checkpoint
from phalanx.reported_checkpoint import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)

POLL_S = 0.02
PENDING = ReportedCheckpointStatus.PENDING_VALIDATION.value


def reported_checkpoints(
    session: Any, mode: CheckpointConsistencyMode, timeout_s: float | None
) -> list[ReportedCheckpoint]:
    """Wait until the snapshot has committed this rank's last checkpoint; then list them all."""
    session.finish_uploads()  # ASYNC parts are reported only once they are stored
    wanted = session.last_checkpoint_round + 1  # the snapshot's next_round once it is committed
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        state = _read_snapshot(session.storage)
        statuses = state.get("statuses", {})
        committed = int(state.get("next_round", 0)) >= wanted
        pending = mode is CheckpointConsistencyMode.VALIDATED and PENDING in statuses.values()
        if committed and not pending:
            return [_reported(session.storage, c, statuses) for c in state.get("checkpoints", [])]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"get_all_reported_checkpoints(timeout_s={timeout_s}) timed out: "
                + (
                    "validations are still running."
                    if committed
                    else "checkpoints of this "
                    "rank's reports are not committed yet (other ranks have not reported them)."
                )
            )
        if pending:
            session.nudge_driver()
        time.sleep(POLL_S)


def _read_snapshot(storage: Any) -> dict[str, Any]:
    try:
        state = read_state(storage)  # the snapshot with the journal of recent commits
    except (ValueError, KeyError, TypeError):  # mid-write on a store without atomic replace
        return {}
    return state if isinstance(state, dict) else {}


def _reported(storage: Any, entry: dict[str, Any], statuses: dict[str, str]) -> ReportedCheckpoint:
    name = entry["dir_name"]
    status = ReportedCheckpointStatus(statuses.get(name, ReportedCheckpointStatus.COMMITTED.value))
    checkpoint = Checkpoint(storage.checkpoint_path(name), storage.filesystem)
    return ReportedCheckpoint(checkpoint, dict(entry["metrics"]), status)
