"""The Ray engine end to end, on a local Ray instance: what only Ray has (actors, placement,
Ray Data, cluster resources). What every engine does: tests/engines/test_contract.py."""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time

import pytest
from _helpers import wait_until

pytest.importorskip("ray")

import phalanx as train
from phalanx import (
    ConfigError,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    StorageError,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def fit(fn, storage, workers=2, config=None, name="run", scaling=None, **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=scaling or ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


def test_each_rank_is_its_own_ray_actor(storage):
    """Ranks, reports and history on Ray: tests/engines/test_contract.py; the actors: here."""

    def loop():
        import ray

        ctx = train.get_context()
        train.report(
            {"rank": ctx.get_world_rank(), "actor": ray.get_runtime_context().get_actor_id()}
        )

    result = fit(loop, storage)  # engine=None: Ray is initialised, so the Ray engine
    assert result.metrics["rank"] == 0
    actors = result.all_ranks_metrics_dataframe.sort_values("rank")["actor"]
    assert all(actors) and len(set(actors)) == 2


def test_bars_and_prompts_reach_the_driver_while_the_actor_waits(storage, tmp_path, capfd):
    go = str(tmp_path / "go")

    def loop():
        sys.stderr.write("\r 10%|#")  # a progress bar's redraw: no newline
        sys.stderr.flush()
        sys.stdout.write("continue? ")  # an input() prompt
        sys.stdout.flush()
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        print("yes")

    seen = {"out": "", "err": ""}
    runner = threading.Thread(target=fit, args=(loop, storage, 1))
    runner.start()
    try:

        def arrived() -> bool:
            out, err = capfd.readouterr()
            seen["out"] += out
            seen["err"] += err
            return "[rank0]: continue? " in seen["out"] and "\r[rank0]:  10%|#" in seen["err"]

        wait_until(arrived, timeout_s=60, what="the prompt and the bar")
        assert "yes" not in seen["out"]  # the worker is still waiting
    finally:
        open(go, "w").close()
        runner.join(timeout=60)
    out, _ = capfd.readouterr()
    assert "continue? yes\n" in seen["out"] + out, seen


def test_torch_ddp_with_gloo_on_two_actors(storage):
    pytest.importorskip("torch")
    from phalanx.torch import TorchTrainer

    def loop():
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(tensor)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        model(torch.ones(4, 2)).sum().backward()
        train.report({"sum": tensor.item(), "world": dist.get_world_size()})

    result = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="ddp", storage_path=storage),
    ).fit()
    assert result.metrics == {"sum": 3.0, "world": 2}


def test_ray_datasets_are_split_per_rank_with_streaming_split(storage):
    import ray.data

    from phalanx.data._ray_data import is_ray_dataset, split_ray_dataset

    ds = ray.data.range(100)
    assert is_ray_dataset(ds) and not is_ray_dataset([1, 2])
    shards = split_ray_dataset(ds, 2)

    def loop(config):
        shard = config["shards"][train.get_context().get_world_rank()]
        ids = [int(i) for b in shard.iter_batches(batch_size=10) for i in b["id"]]
        train.report({"ids": ids})

    result = fit(loop, storage, config={"shards": shards})
    ranks = result.all_ranks_metrics_dataframe
    ids = [sorted(row) for row in ranks.sort_values("rank")["ids"]]
    assert len(ids[0]) == len(ids[1]) == 50
    assert sorted(ids[0] + ids[1]) == list(range(100))


def test_resources_the_cluster_never_has_fail_at_once(storage):
    cases = [
        (ScalingConfig(num_workers=2, resources_per_worker={"CPU": 3}), "need {CPU=6}"),
        (ScalingConfig(num_workers=1, use_gpu=True), "GPU=1"),
        (ScalingConfig(num_workers=1, resources_per_worker={"tpu_slice": 1}), "tpu_slice"),
    ]
    for scaling, match in cases:
        start = time.monotonic()
        with pytest.raises(ConfigError, match="can never be placed") as info:
            fit(lambda: None, storage, scaling=scaling)
        assert match in str(info.value) and "the cluster has" in str(info.value)
        assert "HINT:" in str(info.value)
        assert time.monotonic() - start < 5.0  # not after the workers' start timeout


def test_a_request_for_busy_resources_waits_and_says_so(storage, monkeypatch, caplog):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from phalanx._internal.engines.ray import engine as ray_engine

    monkeypatch.setattr(ray_engine, "WAIT_LOG_EVERY_S", 0.2)
    blocker = placement_group([{"CPU": 4}])
    ray.get(blocker.ready(), timeout=30)
    outcome: queue.Queue = queue.Queue()

    def run():
        try:
            outcome.put(fit(lambda: train.report({"ok": 1}), storage, workers=1))
        except BaseException as exc:
            outcome.put(exc)

    caplog.set_level(logging.WARNING, logger="phalanx._internal.engines.ray.engine")
    runner = threading.Thread(target=run)
    runner.start()
    try:
        wait_until(lambda: "Waiting" in caplog.text, 20, "the waiting message")
        assert "available now" in caplog.text and "{CPU=1}" in caplog.text
    finally:
        remove_placement_group(blocker)
        runner.join(60)
    result = outcome.get_nowait()
    assert not isinstance(result, BaseException), result
    assert result.metrics == {"ok": 1}


def test_workers_that_cannot_see_the_run_directory_fail_with_a_hint(tmp_path):
    from phalanx._internal.engines.base import WorkerGroupSpec
    from phalanx._internal.engines.ray.engine import RayEngine

    run_dir = tmp_path / "run"  # no .phalanx_run marker: as if on another machine's disk
    engine = RayEngine()
    spec = WorkerGroupSpec(1, ScalingConfig(num_workers=1), "r", str(run_dir / "logs"))
    try:
        with pytest.raises(StorageError, match="cannot see the run directory") as info:
            engine.launch(spec, queue.Queue())
    finally:
        engine.close()
    assert ".phalanx_run does not exist on this node" in str(info.value)
    assert "HINT: use a filesystem shared by every node" in str(info.value)
