"""Goodput on the Ray engine: checkpoints, a slow rank and a killed rank show where they were
injected, and the parts add up to the wall time, as on the local engine
(``tests/controller/test_goodput_run.py``); with a ``ray.data.Dataset``, the time the training
loop waits for Ray Data's batches (a slow map stage) is counted in the data part, as phalanx's
own datasets'. One module: one Ray instance for both."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.collective import barrier

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

STEPS, KILL_AT, SLOW_S = 6, 4, 0.1


def loop(config):
    context = train.get_context()
    rank, first_attempt = context.get_world_rank(), context.get_attempt() == 0
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, STEPS):
        time.sleep(0.02 + (SLOW_S if rank == 1 else 0.0))
        if first_attempt and rank == 1 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            ckpt = Checkpoint.from_directory(d) if rank == 0 and step % 2 == 1 else None
            train.report({"step": step}, checkpoint=ckpt)
        barrier()


def test_the_parts_show_where_injected_and_add_up_on_the_ray_engine(storage):
    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2, engine="ray"),
        run_config=RunConfig(
            name="run", storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    goodput = result.goodput
    assert result.attempts == 2
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s, rel=0.02)
    parts = goodput.seconds
    assert parts["stragglers"] >= 0.5 * SLOW_S * (KILL_AT - 1 + STEPS - KILL_AT + 1), parts
    assert parts["checkpoints"] > 0.0 and parts["failures"] > SLOW_S, parts
    assert parts["startup"] > 0.0 and parts["productive"] > 0.0, parts
    assert parts["data"] == 0.0, parts  # no dataset
    assert goodput.attempts[1]["startup"] == 0.0


BATCHES, DELAY_S = 6, 0.3


def data_loop(config):
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
        data_loop,
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
