"""A ``ray.data.Dataset`` on the Ray engine at a resume: its epoch starts over (Ray Data's
streaming split cannot restart mid-epoch), said once; a phalanx dataset beside it continues."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def loop(config):
    ctx = train.get_context()
    ray_ids = [int(i) for b in train.get_dataset_shard("ray").iter_batches() for i in b["id"]]
    batches = train.get_dataset_shard("train").iter_batches(batch_size=5)
    for step, batch in enumerate(batches):
        ids = [int(i) for i in batch["id"]]
        attempt = ctx.get_attempt()
        save = (attempt, step) == (0, 1)
        checkpoint = Checkpoint.from_directory(config["empty"]) if save else None
        train.report({"ids": ids, "ray_ids": ray_ids if step == 0 else []}, checkpoint=checkpoint)
        if (attempt, step) in ((0, 2), (1, 1)) and ctx.get_world_rank() == 1:
            raise RuntimeError("fails after the checkpoint of attempt 0's step 1")


def test_a_ray_dataset_starts_its_epoch_over_and_says_so_once(storage, tmp_path, caplog):
    import ray.data

    empty = tmp_path / "empty"
    empty.mkdir()
    with caplog.at_level(logging.WARNING):
        result = DataParallelTrainer(
            loop,
            train_loop_config={"empty": str(empty)},
            scaling_config=ScalingConfig(num_workers=2, engine="ray"),
            run_config=RunConfig(
                name="ray_data", storage_path=storage, failure_config=FailureConfig(max_failures=2)
            ),
            datasets={"train": {"id": list(range(40))}, "ray": ray.data.range(40)},
            dataset_config=train.DataConfig(equal_split=False),
        ).fit()
    assert result.attempts == 3
    said = [r.getMessage() for r in caplog.records if "a ray.data.Dataset" in r.getMessage()]
    assert len(said) == 1 and "dataset 'ray' (a ray.data.Dataset) starts its epoch over" in said[0]
    assert "Resuming data from the checkpoint: dataset 'train' at epoch 0, sample 20 of 40" in (
        caplog.text
    )
    history = result.all_ranks_metrics_dataframe
    last = history[history["_phalanx_attempt"] == history["_phalanx_attempt"].max()]
    ray_ids = sorted(i for ids in last["ray_ids"] for i in ids)
    assert ray_ids == list(range(40))  # the whole epoch again, as in Ray Train
