"""The run's snapshot at many checkpoints: same content, and each entry encoded once (B11).

Every commit rewrites the snapshot; with every checkpoint kept (``num_to_keep=None``, Ray's
default) re-encoding all entries each time made a run of k checkpoints cost O(k^2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phalanx import CheckpointConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage


def _manager(tmp_path: Path, keep: int | None = None) -> cm.CheckpointManager:
    storage = RunStorage.create(str(tmp_path), "run")
    storage.prepare()
    return cm.CheckpointManager(storage, CheckpointConfig(num_to_keep=keep))


def _register(manager: cm.CheckpointManager, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        name = f"checkpoint_{i:06d}"
        Path(manager.storage.checkpoint_path(name)).mkdir(parents=True)
        manager.next_round = i + 1
        manager.register(cm.TrackedCheckpoint(name, {"i": i, "loss": 1.0 / (i + 1)}, i))


def _snapshot(manager: cm.CheckpointManager) -> dict[str, Any]:
    raw = manager.storage.read(SNAPSHOT_FILE)
    assert raw is not None
    return json.loads(raw)


def test_snapshot_lists_every_kept_checkpoint_and_a_resume_reads_it_back(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.begin_attempt()
    _register(manager, 5)
    state = _snapshot(manager)
    assert [c["dir_name"] for c in state["checkpoints"]] == [
        f"checkpoint_{i:06d}" for i in range(5)
    ]
    assert state["checkpoints"][3] == {"dir_name": "checkpoint_000003",
                                       "metrics": {"i": 3, "loss": 0.25}, "round": 3}  # fmt: skip
    assert (state["version"], state["latest"], state["next_round"]) == (1, "checkpoint_000004", 5)
    assert len(state["attempts"]) == 1
    resumed = _manager(tmp_path)
    assert resumed.load()
    assert resumed.checkpoints == manager.checkpoints
    assert resumed.latest == manager.latest


def test_metrics_a_validation_adds_reach_the_snapshot(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    _register(manager, 3)
    manager.update_validation("checkpoint_000001", {"val_acc": 0.9}, "VALIDATED")
    entry = _snapshot(manager)["checkpoints"][1]
    assert entry["metrics"] == {"i": 1, "loss": 0.5, "val_acc": 0.9}
    assert _snapshot(manager)["statuses"] == {"checkpoint_000001": "VALIDATED"}


def test_evicted_checkpoints_leave_the_snapshot(tmp_path: Path) -> None:
    manager = _manager(tmp_path, keep=2)
    _register(manager, 6)
    manager.close()
    names = [c["dir_name"] for c in _snapshot(manager)["checkpoints"]]
    assert names == ["checkpoint_000004", "checkpoint_000005"]


def test_each_checkpoint_is_encoded_once_however_many_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded_entries = 0
    real = cm.encode_json

    def counting(value: Any) -> str:
        nonlocal encoded_entries
        encoded_entries += isinstance(value, dict) and "dir_name" in value
        return real(value)

    monkeypatch.setattr(cm, "encode_json", counting)
    manager = _manager(tmp_path)
    _register(manager, 200)
    assert encoded_entries == 200  # was 200 * 201 / 2 = 20,100
    assert len(_snapshot(manager)["checkpoints"]) == 200
