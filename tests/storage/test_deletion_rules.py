"""What phalanx deletes or moves in a run directory, one test per rule (the list is in
``run_storage.py``'s docstring); each fails when its rule is loosened.

Held elsewhere: the journal removed only after the snapshot that holds it is durable
(``test_compaction_crash.py``), a lost index re-indexed on local storage and S3 through real
fit() calls (``test_lost_index.py``), history parts folded and a cut line dropped
(``test_history_parts.py``), a config error before any commit set aside
(``tests/controller/test_controller.py``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import phalanx as train
from phalanx import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage.commit_record import CommitRecord, write_commit_record
from phalanx._internal.storage.run_storage import (
    HISTORY_FILE,
    ORPHANED_PREFIX,
    SNAPSHOT_FILE,
    STAGING_DIR,
    RunStorage,
)
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE
from phalanx.errors import ConfigError, StorageError

LOGGER = "phalanx._internal.storage.checkpoint_manager"


def _manager(tmp_path: Path, **config: object) -> cm.CheckpointManager:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    manager = cm.CheckpointManager(storage, CheckpointConfig(**config))  # type: ignore[arg-type]
    manager.begin_attempt()
    return manager


def _write_checkpoint(storage: RunStorage, name: str, record: CommitRecord | None) -> None:
    """A checkpoint directory as a commit leaves it: the rank's file, then (when the commit got
    that far) its record."""
    os.makedirs(storage.checkpoint_path(name))
    Path(storage.checkpoint_path(name), "model.bin").write_bytes(b"weights of " + name.encode())
    if record is not None:
        write_commit_record(storage, record)


def _commit(manager: cm.CheckpointManager, round_: int, metrics: dict) -> str:  # type: ignore[type-arg]
    name = f"checkpoint_{round_:06d}"
    _write_checkpoint(manager.storage, name, CommitRecord(name, round_, 0, metrics, None))
    manager.register(cm.TrackedCheckpoint(name, metrics, round_))
    return name


def _checkpoint_dirs(storage: RunStorage) -> list[str]:
    return sorted(n for n in os.listdir(storage.run_path) if n.startswith("checkpoint_0"))


def test_retention_deletes_the_evicted_checkpoints_and_nothing_else(tmp_path: Path) -> None:
    manager = _manager(tmp_path, num_to_keep=2, checkpoint_score_attribute="acc")
    run = manager.storage.run_path
    os.makedirs(os.path.join(run, "my_notes"))  # the user's own folder in the run directory
    os.makedirs(os.path.join(run, f"{ORPHANED_PREFIX}20260101-000000", "checkpoint_000009"))
    for round_, acc in enumerate([0.5, 0.9, 0.1, 0.7]):
        _commit(manager, round_, {"acc": acc})
    manager.close()  # waits for the background deletions
    assert _checkpoint_dirs(manager.storage) == ["checkpoint_000001", "checkpoint_000003"]
    assert [c.dir_name for c in manager.checkpoints] == ["checkpoint_000001", "checkpoint_000003"]
    assert os.path.isdir(os.path.join(run, "my_notes"))
    assert os.path.isdir(
        os.path.join(run, f"{ORPHANED_PREFIX}20260101-000000", "checkpoint_000009")
    )


def test_a_commit_whose_index_entry_fails_deletes_its_own_directory_only(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    storage = manager.storage
    _commit(manager, 0, {"step": 0})  # compacts: the snapshot
    _commit(manager, 1, {"step": 1})  # the journal
    journal = storage.path(JOURNAL_FILE)
    os.rename(journal, f"{journal}.kept")
    os.mkdir(journal)  # the next journal append fails (a directory where the file goes)
    with pytest.raises(StorageError, match="snapshot_journal"):
        _commit(manager, 2, {"step": 2})
    assert _checkpoint_dirs(storage) == ["checkpoint_000000", "checkpoint_000001"]
    assert [c.dir_name for c in manager.checkpoints] == ["checkpoint_000000", "checkpoint_000001"]


def test_unindexed_directories_staged_parts_go_committed_ones_are_reindexed_others_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path)
    storage = manager.storage
    _commit(manager, 0, {"step": 0})
    staging = os.path.join(storage.run_path, STAGING_DIR)
    # round 1 committed (its record written), its index entry cut off; a stale staging name of
    # it from an earlier attempt must not make it look uncommitted
    _write_checkpoint(
        storage, "checkpoint_000001", CommitRecord("checkpoint_000001", 1, 1, {}, None)
    )
    os.makedirs(os.path.join(staging, "checkpoint_000001.0"))
    # round 2: a rank's part staged for a commit that never came
    os.makedirs(os.path.join(staging, "checkpoint_000002.1"))
    Path(staging, "checkpoint_000002.1", "part_0").write_bytes(b"half")
    # round 3: a NO_UPLOAD part written in place, its commit never came (no record)
    _write_checkpoint(storage, "checkpoint_000003", None)
    Path(staging, "checkpoint_000003.1.in_place").write_bytes(b"")
    # a directory named like a checkpoint that nothing explains: set aside, whole
    _write_checkpoint(storage, "checkpoint_000004", None)
    fresh = cm.CheckpointManager(storage, CheckpointConfig())
    assert fresh.load()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        recovery = fresh.recover_unindexed()
    assert [r.dir_name for r in recovery.reindexed] == ["checkpoint_000001"]
    assert recovery.removed == ["checkpoint_000003"]
    assert recovery.set_aside == ["checkpoint_000004"]
    assert [c.dir_name for c in fresh.checkpoints] == ["checkpoint_000000", "checkpoint_000001"]
    assert fresh.latest is not None and fresh.latest.dir_name == "checkpoint_000001"
    assert not os.path.exists(staging)
    assert _checkpoint_dirs(storage) == ["checkpoint_000000", "checkpoint_000001"]
    (aside,) = [n for n in os.listdir(storage.run_path) if n.startswith(ORPHANED_PREFIX)]
    kept = Path(storage.run_path, aside, "checkpoint_000004", "model.bin")
    assert kept.read_bytes() == b"weights of checkpoint_000004"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("checkpoint_000004" in w and "not deleted" in w for w in warnings)
    assert any("checkpoint_000001 is a committed checkpoint" in w for w in warnings)
    # the re-index is durable: a third reader sees it without re-indexing
    third = cm.CheckpointManager(storage, CheckpointConfig())
    assert third.load() and third.recover_unindexed().reindexed == []
    assert [c.dir_name for c in third.checkpoints] == ["checkpoint_000000", "checkpoint_000001"]


def _scored_loop(config: dict) -> None:  # type: ignore[type-arg]
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["step"] + 1
    for step in range(start, 3):
        d = Path(config["scratch"], f"step_{step}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "state.json").write_text(json.dumps({"step": step}))
        metrics = {"step": step, "acc": 0.1 * step} if step < config["scored"] else {"step": step}
        train.report(metrics, checkpoint=Checkpoint.from_directory(str(d)))


@pytest.mark.slow
def test_a_config_error_after_a_commit_keeps_the_run_when_its_index_is_lost(
    tmp_path: Path,
) -> None:
    """The set-aside of a config error's run files is for a fit() that committed nothing: a run
    that did commit (known from its checkpoints' records, its index lost) is resumed whole."""

    def fit(scored: int) -> train.Result:
        return DataParallelTrainer(
            _scored_loop,
            train_loop_config={"scratch": str(tmp_path / f"scratch{scored}"), "scored": scored},
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(
                name="run",
                storage_path=str(tmp_path / "runs"),
                checkpoint_config=CheckpointConfig(checkpoint_score_attribute="acc"),
            ),
        ).fit()

    with pytest.raises(ConfigError, match="acc"):
        fit(scored=1)  # round 0 commits; round 1 has no 'acc': a config error
    run = tmp_path / "runs" / "run"
    (run / SNAPSHOT_FILE).unlink()  # the index is lost
    if (run / JOURNAL_FILE).exists():
        (run / JOURNAL_FILE).unlink()
    result = fit(scored=3)  # the config fixed
    assert not [n for n in os.listdir(run) if n.startswith("config_error_")]
    assert result.metrics["step"] == 2
    steps = [json.loads(line)["step"] for line in (run / HISTORY_FILE).read_text().splitlines()]
    assert steps == [0, 1, 2]  # the first fit's round 0 kept in the history, resumed after it
