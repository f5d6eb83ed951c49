"""Goodput on the Ray engine with a ``ray.data.Dataset``: the time the training loop waits for
Ray Data's batches (a slow map stage) is counted in the data part, as phalanx's own datasets'."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

BATCHES, DELAY_S = 6, 0.3


def loop(config):
    shard = train.get_dataset_shard("train")
    for step, _batch in enumerate(
        shard.iter_batches(batch_size=config["rows"], prefetch_batches=0)
    ):
        train.report({"step": step})


def test_waits_for_ray_data_batches_count_as_data_time(storage):
    import ray.data

    rows = 4

    def slow_map(batch):  # nested: pickled by value, Ray Data's actors cannot import tests
        time.sleep(DELAY_S)  # a slow decoder: the loop waits for each batch
        return batch

    # one block per batch, one map task at a time: each batch is waited for
    dataset = ray.data.range(BATCHES * rows, override_num_blocks=BATCHES).map_batches(
        slow_map, batch_size=rows, concurrency=1
    )
    result = DataParallelTrainer(
        loop,
        train_loop_config={"rows": rows},
        scaling_config=ScalingConfig(num_workers=1, engine="ray"),
        datasets={"train": dataset},
        run_config=RunConfig(name="data", storage_path=storage),
    ).fit()
    goodput = result.goodput
    assert result.metrics["step"] == BATCHES - 1
    # the loop only waits: at least the first batch's map (the pipeline starts with the loop),
    # and without the waits counted the part is exactly 0
    assert goodput.seconds["data"] >= DELAY_S, goodput.seconds
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s, rel=0.02)
