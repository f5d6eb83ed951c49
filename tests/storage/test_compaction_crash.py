"""A compaction of the checkpoint index stopped after any of its steps loses no checkpoint
(issue 40): the new snapshot is written and made durable before the journal it replaces is
removed, so a rerun's index alone (no re-indexing from commit records) lists every committed
checkpoint. Stopped by an error in this process and by a SIGKILLed process, after each step
(``compaction_child.py``). Were the journal removed first, a stop between the two would leave
the old snapshot without the records that came after it: these tests fail then.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from compaction_child import COMMITTED, STEPS, commit_all_then_compact

from phalanx import CheckpointConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compaction_child.py")


def _raise() -> None:
    raise OSError(28, "No space left on device (the compaction stopped here)")


def rerun_sees_every_checkpoint(runs: str) -> None:
    """What a rerun of the run reads: its index lists every committed checkpoint, the latest
    last, and nothing had to be re-indexed or set aside."""
    manager = cm.CheckpointManager(RunStorage.create(runs, "run"), CheckpointConfig())
    assert manager.load(), "the rerun must find the run's index"
    assert [c.dir_name for c in manager.checkpoints] == COMMITTED
    assert manager.latest is not None and manager.latest.dir_name == COMMITTED[-1]
    assert manager.resume_round() == len(COMMITTED)
    recovery = manager.recover_unindexed()
    assert (recovery.reindexed, recovery.set_aside) == ([], [])
    on_disk = os.listdir(os.path.join(runs, "run"))  # every checkpoint kept where it was
    assert sorted(n for n in on_disk if n.startswith("checkpoint_0")) == COMMITTED


@pytest.mark.parametrize("step", STEPS)
def test_a_compaction_stopped_by_an_error_after_each_step_loses_no_checkpoint(
    tmp_path: Path, step: str
) -> None:
    runs = str(tmp_path / "runs")
    # the error reaches the caller of close(), as a fit()'s would
    with pytest.raises(StorageError, match="the compaction stopped here"):
        commit_all_then_compact(runs, step, _raise)
    rerun_sees_every_checkpoint(runs)


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
def test_a_compaction_sigkilled_after_each_step_loses_no_checkpoint(
    tmp_path: Path, step: str
) -> None:
    runs = str(tmp_path / "runs")
    child = subprocess.run(
        [sys.executable, CHILD, runs, step], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, f"the child was not killed at {step!r}: {child.stderr}"
    rerun_sees_every_checkpoint(runs)
