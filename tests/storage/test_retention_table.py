"""Checkpoint retention, row by row: which checkpoint directories a user finds in the run after
a sequence of commits, for each CheckpointConfig. Real storage (fsspec's ``memory://``)."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from phalanx import CheckpointConfig, ConfigError
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage


@pytest.fixture
def run() -> Iterator[RunStorage]:
    root = f"memory://retention-{uuid.uuid4().hex}"
    storage = RunStorage.create(root, "run")
    storage.filesystem.makedirs(storage.run_path, exist_ok=True)
    yield storage
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def commit_all(run: RunStorage, config: CheckpointConfig, metrics: list[dict[str, Any]]) -> Any:
    manager = CheckpointManager(run, config)
    try:
        for index, m in enumerate(metrics):
            name = f"checkpoint_{index:06d}"
            run.filesystem.pipe(f"{run.run_path}/{name}/model.pt", b"weights")
            manager.register(TrackedCheckpoint(name, m, index))
    finally:
        manager.close()  # background deletions done
    return manager


def on_storage(run: RunStorage) -> list[int]:
    names = [
        p.rstrip("/").rsplit("/", 1)[-1] for p in run.filesystem.ls(run.run_path, detail=False)
    ]
    return sorted(int(n.split("_")[1]) for n in names if n.startswith("checkpoint_0"))


acc = [{"acc": a} for a in (0.5, 0.9, 0.7, 0.8, 0.6)]

# (why, config, each commit's metrics, the checkpoints left on storage, best last)
ROWS = [
    ("keep everything by default", CheckpointConfig(), acc, [0, 1, 2, 3, 4], None),
    ("keep the newest 2", CheckpointConfig(num_to_keep=2), acc, [3, 4], 4),
    (
        "keep the best 2 by max acc, and the latest until a newer commits",
        CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"),
        acc,
        [1, 3, 4],
        1,
    ),
    (
        "keep the best 1 by min loss",
        CheckpointConfig(
            num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        ),
        [{"loss": v} for v in (3.0, 1.0, 2.0)],
        [1, 2],
        1,
    ),
    (
        "a NaN score ranks below every number",
        CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"),
        [{"acc": math.nan}, {"acc": 0.1}, {"acc": 0.2}],
        [2],
        2,
    ),
    (
        "a tie keeps the newer checkpoint",
        CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"),
        [{"acc": 1.0}, {"acc": 1.0}, {"acc": 0.0}],
        [1, 2],
        1,
    ),
    (
        "a nested metric is named with a slash",
        CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val/acc"),
        [{"val": {"acc": a}} for a in (0.9, 0.1, 0.2)],
        [0, 2],
        0,
    ),
]


@pytest.mark.parametrize(
    ("config", "metrics", "kept", "best"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_which_checkpoints_are_kept(run, config, metrics, kept, best):
    manager = commit_all(run, config, metrics)
    assert on_storage(run) == kept
    snapshot = json.loads(run.filesystem.cat(f"{run.run_path}/{SNAPSHOT_FILE}"))
    assert sorted(int(c["dir_name"].split("_")[1]) for c in snapshot["checkpoints"]) == kept
    assert snapshot["latest"] == f"checkpoint_{len(metrics) - 1:06d}"  # latest is always kept
    if best is not None:  # Result.best_checkpoints: worst first, so the best is last
        assert manager.best_checkpoints()[-1][0].path.endswith(f"checkpoint_{best:06d}")


def test_a_missing_score_metric_keeps_the_checkpoint_and_says_how_to_fix_it(run):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")
    with pytest.raises(ConfigError, match="has no metric 'acc'") as info:
        commit_all(run, config, [{"loss": 1.0}])
    assert "HINT:" in str(info.value)
    assert on_storage(run) == [0]


def test_a_checkpoint_pending_validation_is_never_evicted(run):
    manager = CheckpointManager(run, CheckpointConfig(num_to_keep=1))
    try:
        for index in range(3):
            name = f"checkpoint_{index:06d}"
            run.filesystem.pipe(f"{run.run_path}/{name}/model.pt", b"weights")
            manager.register(TrackedCheckpoint(name, {}, index), pending_validation=index == 0)
    finally:
        manager.close()
    assert on_storage(run) == [0, 2]
    manager.update_validation("checkpoint_000000", {"val": 1.0}, "VALIDATED")
    manager.close()
    assert on_storage(run) == [2]
