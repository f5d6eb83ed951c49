"""The snapshot's ``next_round`` after rounds without a checkpoint: written when a rank waits for
them in ``get_all_reported_checkpoints`` (one journal record), never twice for the same round."""

from __future__ import annotations

from pathlib import Path

from phalanx import CheckpointConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage import snapshot_journal as sj
from phalanx._internal.storage.run_storage import RunStorage


def _records(storage: RunStorage) -> int:
    return len(sj.read_records(storage))


def test_record_next_round_writes_once_per_change(tmp_path: Path) -> None:
    storage = RunStorage.create(str(tmp_path), "run")
    storage.prepare()
    manager = cm.CheckpointManager(storage, CheckpointConfig())
    manager.begin_attempt()  # a compaction: next_round 0 is on disk
    manager.next_round = 3  # rounds 0-2 carried no checkpoint: nothing was written for them
    assert sj.read_state(storage)["next_round"] == 0

    manager.record_next_round()
    assert sj.read_state(storage)["next_round"] == 3
    assert _records(storage) == 1  # one appended record, not a rewrite of the snapshot
    manager.record_next_round()
    assert _records(storage) == 1  # unchanged: nothing written

    manager.next_round = 4
    manager.register(cm.TrackedCheckpoint("checkpoint_000003", {}, 3))
    manager.record_next_round()  # the commit wrote next_round 4 already
    state = sj.read_state(storage)
    assert (state["next_round"], _records(storage)) == (4, 2)
    assert [c["dir_name"] for c in state["checkpoints"]] == ["checkpoint_000003"]
