"""The run's snapshot at many checkpoints: same content, each entry encoded once, and a commit
appends one journal record instead of rewriting the snapshot (B11).

With every checkpoint kept (``num_to_keep=None``, Ray's default) rewriting (and re-encoding) all
entries at every commit made a run of k checkpoints cost O(k^2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phalanx import CheckpointConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage import snapshot_journal as sj
from phalanx._internal.storage.local_store import LocalStore
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage
from phalanx._internal.storage.snapshot_journal import read_state


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


def _committed(tmp_path: Path, n: int, keep: int | None = None) -> cm.CheckpointManager:
    """A new run's manager after its first attempt registered checkpoints 0 to n - 1."""
    manager = _manager(tmp_path, keep)
    manager.begin_attempt()
    _register(manager, n)
    return manager


def _snapshot(manager: cm.CheckpointManager) -> dict[str, Any]:
    """What every reader sees: the snapshot with its journal applied."""
    state = read_state(manager.storage)
    assert state is not None
    return state


def _snapshot_file(manager: cm.CheckpointManager) -> dict[str, Any]:
    raw = manager.storage.read(SNAPSHOT_FILE)
    assert raw is not None
    return json.loads(raw)


def test_snapshot_lists_every_kept_checkpoint_and_a_resume_reads_it_back(tmp_path: Path) -> None:
    manager = _committed(tmp_path, 5)
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


# -- the journal: a commit appends one record; the snapshot is compacted now and then --------------


def test_a_thousand_commits_rewrite_the_snapshot_a_handful_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewrites: list[int] = []
    real = LocalStore.write_atomic

    def counting(self: RunStorage, relative: str, data: bytes) -> None:
        if relative == SNAPSHOT_FILE:
            rewrites.append(len(data))
        real(self, relative, data)

    monkeypatch.setattr(LocalStore, "write_atomic", counting)
    manager = _committed(tmp_path, 1000)
    # was 1,001 whole rewrites (~60 MB in all); now compactions as the journal doubles
    assert 3 <= len(rewrites) <= 10
    assert sum(rewrites) < 4 * rewrites[-1]  # O(k) bytes in all, not O(k^2)
    journal = tmp_path / "run" / sj.JOURNAL_FILE
    lines = journal.read_bytes().splitlines()  # one short line per commit since the last one
    assert 0 < len(lines) <= len(_snapshot_file(manager)["checkpoints"])
    assert max(map(len, lines)) < 300
    assert [c["dir_name"] for c in _snapshot(manager)["checkpoints"]] == [
        f"checkpoint_{i:06d}" for i in range(1000)
    ]


def test_a_resume_reads_the_snapshot_and_its_journal(tmp_path: Path) -> None:
    manager = _committed(tmp_path, 100)
    manager.update_validation("checkpoint_000099", {"val": 1.5}, "VALIDATED")
    assert (tmp_path / "run" / sj.JOURNAL_FILE).exists()  # 36 commits since the compaction
    assert len(_snapshot_file(manager)["checkpoints"]) < 100
    resumed = _manager(tmp_path)
    assert resumed.load()
    assert resumed.checkpoints == manager.checkpoints
    assert (resumed.latest, resumed.next_round) == (manager.latest, 100)
    assert resumed.latest is not None and resumed.latest.metrics["val"] == 1.5
    assert resumed.statuses == {"checkpoint_000099": "VALIDATED"}
    assert resumed.attempt_history == manager.attempt_history


def test_evictions_are_journaled_too(tmp_path: Path) -> None:
    manager = _committed(tmp_path, 20, keep=3)
    manager.close()
    resumed = _manager(tmp_path, keep=3)
    resumed.load()
    assert [c.dir_name for c in resumed.checkpoints] == [
        f"checkpoint_{i:06d}" for i in (17, 18, 19)
    ]


def test_the_end_of_fit_leaves_one_whole_snapshot_and_no_journal(tmp_path: Path) -> None:
    manager = _committed(tmp_path, 10)
    manager.close()
    assert not (tmp_path / "run" / sj.JOURNAL_FILE).exists()
    state = _snapshot_file(manager)  # what a phalanx without the journal reads
    assert [c["dir_name"] for c in state["checkpoints"]][-1] == "checkpoint_000009"
    assert state["latest"] == "checkpoint_000009" and state["journal_seq"] == 10


def test_a_record_cut_by_a_crash_is_not_a_commit_and_the_next_write_compacts(
    tmp_path: Path,
) -> None:
    _committed(tmp_path, 5)
    journal = tmp_path / "run" / sj.JOURNAL_FILE
    with journal.open("ab") as f:  # the driver died mid-append of checkpoint 5's record
        f.write(b'{"seq": 6, "latest": "checkpoint_000005", "next_ro')
    resumed = _manager(tmp_path)
    assert resumed.load()
    assert resumed.latest is not None and resumed.latest.dir_name == "checkpoint_000004"
    assert len(resumed.checkpoints) == 5
    resumed.begin_attempt()  # the first write after a load rewrites the snapshot whole
    assert not journal.exists()
    _register(resumed, 3, start=5)
    again = _manager(tmp_path)
    again.load()
    assert [c.round for c in again.checkpoints] == list(range(8))


def test_a_crash_between_compaction_and_removing_the_journal_replays_nothing_twice(
    tmp_path: Path,
) -> None:
    manager = _committed(tmp_path, 7)
    journal = tmp_path / "run" / sj.JOURNAL_FILE
    records = journal.read_bytes()
    manager.close()  # compacts and removes the journal...
    journal.write_bytes(records)  # ...as if the crash came before the removal
    resumed = _manager(tmp_path)
    resumed.load()
    assert [c.round for c in resumed.checkpoints] == list(range(7))


def test_a_snapshot_written_before_the_journal_existed_loads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_000000").mkdir()
    (run / SNAPSHOT_FILE).write_text(  # the layout of earlier versions: no journal_seq
        '{"version": 1, "latest": "checkpoint_000000", "next_round": 1, "attempts": [], '
        '"statuses": {}, "checkpoints": [{"dir_name": "checkpoint_000000", '
        '"metrics": {"loss": 1.0}, "round": 0}]}'
    )
    manager = _manager(tmp_path)
    assert manager.load()
    assert manager.latest == cm.TrackedCheckpoint("checkpoint_000000", {"loss": 1.0}, 0)
    manager.begin_attempt()
    _register(manager, 2, start=1)
    resumed = _manager(tmp_path)
    resumed.load()
    assert [c.round for c in resumed.checkpoints] == [0, 1, 2]


def test_a_reader_that_raced_a_compaction_sees_a_gap_and_reads_again() -> None:
    state = {"journal_seq": 3, "checkpoints": [], "statuses": {}, "next_round": 0}
    newer_journal = [{"seq": 9, "next_round": 9, "put": [], "remove": [], "statuses": {}}]
    assert not sj.apply_records(state, newer_journal)
