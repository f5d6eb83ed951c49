"""Elastic training (``ScalingConfig(num_workers=(min, max))``) on a fake multi-node Ray cluster.

Workers ask for the custom resource ``elastic`` only, which the nodes added here hold, so how many
workers fit is exactly what the test gives: a node with ``elastic: 2`` holds two.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest
from _helpers import elastic_group, fit_in_thread, fit_result, wait_until

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.errors import TrainingFailedError

pytestmark = pytest.mark.slow

ELASTIC = {"elastic": 1}


def elastic_loop(config):
    """Rounds from the checkpoint on; every rank reports the world size it sees and, for each
    dataset named in ``config["shards"]`` (name -> column), the rows of its shard. Attempt 0 stops
    after round ``hold_after`` and waits to be torn down (a node is removed under it)."""
    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["round"] + 1
    for step in range(start, config["rounds"]):
        shards = {
            name: [row[column] for row in train.get_dataset_shard(name).iter_rows()]
            for name, column in config.get("shards", {}).items()
        }
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"round": step}, f)
            train.report(
                {
                    "step": step,
                    "world_size": ctx.get_world_size(),
                    "try": ctx.get_attempt(),
                    **shards,
                },
                checkpoint=Checkpoint.from_directory(d) if ctx.get_world_rank() == 0 else None,
            )
        if ctx.get_attempt() == 0 and step == config["hold_after"]:
            while True:
                time.sleep(0.1)


def start_fit(scaling, storage, config, max_failures=1, datasets=None):
    """fit() in a thread; the queue gets its Result or its exception."""
    trainer = DataParallelTrainer(
        elastic_loop,
        train_loop_config=config,
        scaling_config=scaling,
        datasets=datasets,
        run_config=RunConfig(
            name="elastic",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return fit_in_thread(trainer)


def committed(storage):
    run = os.path.join(storage, "elastic")
    if not os.path.isdir(run):
        return []
    return sorted(n for n in os.listdir(run) if n.startswith("checkpoint_0"))


@pytest.mark.timeout(300)
def test_starts_below_max_then_continues_smaller_after_a_node_loss(nodes, storage):
    nodes.add({"elastic": 2})
    doomed = nodes.add({"elastic": 1})
    nodes.wait()
    scaling = ScalingConfig(num_workers=(2, 4), resources_per_worker=ELASTIC)
    runner, outcome = start_fit(scaling, storage, {"rounds": 6, "hold_after": 2})
    # Attempt 0: 3 of max 4 fit; it commits rounds 0..2, then holds.
    wait_until(lambda: len(committed(storage)) == 3, 90, "attempt 0's three checkpoints")
    nodes.kill(doomed)
    result = fit_result(runner, outcome, 120)

    rows = result.all_ranks_metrics_dataframe
    per_step = rows.groupby("step").agg(
        ranks=("rank", lambda r: sorted(r)), size=("world_size", "max"), attempt=("try", "max")
    )
    # Attempt 0 ran at 3 workers (every rank saw 3), attempt 1 at 2, from the round-2 checkpoint:
    # every round has exactly one row per rank of the size that ran it, none lost or repeated.
    assert list(per_step.index) == [0, 1, 2, 3, 4, 5]
    assert list(per_step["size"]) == [3, 3, 3, 2, 2, 2]
    assert list(per_step["attempt"]) == [0, 0, 0, 1, 1, 1]
    assert [sum(r) for r in per_step["ranks"]] == [3, 3, 3, 1, 1, 1]  # 0+1+2, then 0+1
    assert (rows["world_size"] == rows.groupby("step")["rank"].transform("count")).all()
    assert committed(storage) == [f"checkpoint_{i:06d}" for i in range(6)]
    assert result.metrics["world_size"] == 2 and result.metrics["step"] == 5


def test_below_min_waits_then_fails_with_a_clear_error(nodes, storage, monkeypatch, caplog):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes.add({"elastic": 3})
    nodes.wait()
    hog = placement_group([{"elastic": 2}])  # another job holds 2 of the 3
    ray.get(hog.ready(), timeout=30)
    monkeypatch.setenv("PHALANX_WORKER_START_TIMEOUT_S", "3")
    try:
        scaling = ScalingConfig(num_workers=(2, 3), resources_per_worker=ELASTIC)
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="phalanx"):
            runner, outcome = start_fit(scaling, storage, {"rounds": 1, "hold_after": -1}, 0)
            runner.join(60)
        error = outcome.get_nowait()
    finally:
        remove_placement_group(hog)
    assert isinstance(error, TrainingFailedError), error
    assert time.monotonic() - started >= 3
    assert "could not place min_workers=2 workers of {elastic=1} within 3 s" in str(error)
    assert "HINT:" in str(error)
    assert any("Waiting" in r.message and "at least 2 workers" in r.message for r in caplog.records)


def test_below_min_waits_and_starts_when_capacity_frees(nodes, storage, tmp_path, caplog):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes.add({"elastic": 3})
    nodes.wait()
    hog = placement_group([{"elastic": 2}])
    ray.get(hog.ready(), timeout=30)
    scaling = ScalingConfig(num_workers=(2, 3), resources_per_worker=ELASTIC)
    with caplog.at_level("WARNING", logger="phalanx"):
        runner, outcome = start_fit(scaling, storage, {"rounds": 1, "hold_after": -1}, 0)

        def said_waiting():
            return any("at least 2 workers" in r.getMessage() for r in caplog.records)

        wait_until(said_waiting, 60, "fit() to say it waits (1 of min 2 fits)")
    assert runner.is_alive() and not committed(storage)
    remove_placement_group(hog)
    result = fit_result(runner, outcome, 90)
    assert result.metrics["world_size"] == 3  # everything freed: max_workers


@pytest.mark.timeout(300)
def test_a_healthy_group_grows_when_capacity_frees_without_using_the_failure_budget(nodes, storage):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes.add({"elastic": 3})
    nodes.wait()
    hog = placement_group([{"elastic": 1}])  # another job holds 1 of the 3
    ray.get(hog.ready(), timeout=30)
    scaling = elastic_group(3)
    # max_failures=0: the growth restart must not count as a failure.
    runner, outcome = start_fit(scaling, storage, {"rounds": 4, "hold_after": 1}, 0)
    wait_until(lambda: len(committed(storage)) == 2, 90, "attempt 0's two checkpoints")
    remove_placement_group(hog)
    result = fit_result(runner, outcome, 120)
    rows = result.all_ranks_metrics_dataframe
    per_step = rows.groupby("step").agg(size=("world_size", "max"), attempt=("try", "max"))
    assert list(per_step["size"]) == [2, 2, 3, 3]  # grown from the round-1 checkpoint
    assert list(per_step["attempt"]) == [0, 0, 1, 1]
    assert committed(storage) == [f"checkpoint_{i:06d}" for i in range(4)]


@pytest.mark.timeout(300)
def test_a_node_added_mid_run_grows_the_group_and_the_shards_are_split_again(nodes, storage):
    import ray

    from phalanx.data import from_items

    nodes.add({"elastic": 2})
    nodes.wait()
    rows = 24  # splits evenly into 2 and 4: no row is left out by the equal split
    scaling = elastic_group(4)
    datasets = {
        "native": from_items([{"i": i} for i in range(rows)]),
        "on_ray": ray.data.range(rows),
    }
    config = {"rounds": 4, "hold_after": 1, "shards": {"native": "i", "on_ray": "id"}}
    # max_failures=0: growing must not use the failure budget.
    runner, outcome = start_fit(scaling, storage, config, 0, datasets)
    wait_until(lambda: len(committed(storage)) == 2, 120, "attempt 0's two checkpoints")
    nodes.add({"elastic": 2})
    result = fit_result(runner, outcome, 180)

    frame = result.all_ranks_metrics_dataframe
    per_step = frame.groupby("step").agg(
        ranks=("rank", lambda r: sorted(r)), size=("world_size", "max"), attempt=("try", "max")
    )
    # Two workers fit at the start; the added node's two joined at the next attempt, which
    # resumed after the round-1 checkpoint: one row per rank of the size that ran each round.
    assert list(per_step["size"]) == [2, 2, 4, 4]
    assert list(per_step["attempt"]) == [0, 0, 1, 1]
    assert list(per_step["ranks"]) == [[0, 1], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3]]
    # Each round, both datasets were split for the size that ran it: every row on exactly one
    # rank, each rank rows / size of them.
    for step, group in frame.groupby("step"):
        size = int(group["world_size"].max())
        for name in ("native", "on_ray"):
            shards = list(group[name])
            assert all(len(shard) == rows // size for shard in shards), (step, name, shards)
            assert sorted(i for shard in shards for i in shard) == list(range(rows)), (step, name)
    assert committed(storage) == [f"checkpoint_{i:06d}" for i in range(4)]
    assert result.metrics["world_size"] == 4 and result.metrics["step"] == 3
