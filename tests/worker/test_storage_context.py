"""``get_context().get_storage()`` inside a training function: Ray's StorageContext surface, a
small picklable view of where the run lives, never the driver's store (no commit, no claim)."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pyarrow.fs

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._internal.worker.storage_context import StorageContext


def _loop(config: dict[str, Any]) -> None:
    storage = train.get_context().get_storage()
    name = storage.make_default_checkpoint_dir_name()
    path = storage.build_checkpoint_path_from_name(name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "weights"), "w") as f:
        f.write("w")
    seen = {
        "type": type(storage).__name__,
        "storage_path": storage.storage_path,
        "storage_fs_path": storage.storage_fs_path,
        "experiment_dir_name": storage.experiment_dir_name,
        "experiment_fs_path": storage.experiment_fs_path,
        "run_path": storage.run_path,
        "snapshot": storage.checkpoint_manager_snapshot_path,
        "arrow": isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem),
        "name_back": storage.extract_checkpoint_dir_name_from_path(path),
        "store_methods": [m for m in ("commit", "claim", "stage_part") if hasattr(storage, m)],
        "same_after_pickle": str(pickle.loads(pickle.dumps(storage))) == str(storage),
        "name": name,
    }
    train.report(
        {"seen": seen},
        checkpoint=Checkpoint.from_directory(path),
        checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
    )


def test_get_storage_is_rays_storage_context_and_not_the_store(tmp_path: Any) -> None:
    trainer = DataParallelTrainer(
        _loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="ctx", storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    seen = result.metrics["seen"]
    run_dir = os.path.join(str(tmp_path), "ctx")
    assert seen["type"] == StorageContext.__name__
    assert seen["store_methods"] == []  # a training function cannot commit or claim
    assert seen["storage_path"] == seen["storage_fs_path"] == str(tmp_path)
    assert seen["experiment_dir_name"] == "ctx"
    assert seen["experiment_fs_path"] == seen["run_path"] == run_dir
    assert seen["snapshot"] == os.path.join(run_dir, "checkpoint_manager_snapshot.json")
    assert seen["arrow"] and seen["same_after_pickle"]
    assert seen["name_back"] == seen["name"] == "checkpoint_000000"
    assert result.checkpoint is not None
    assert result.checkpoint.path.rstrip("/") == os.path.join(run_dir, seen["name"])
