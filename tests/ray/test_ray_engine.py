"""The Ray engine end to end, on a local Ray instance: the local engine's behaviours, on actors."""

from __future__ import annotations

import logging
import os
import queue
import sys
import tempfile
import threading
import time

import psutil
import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import (
    Callback,
    Checkpoint,
    ConfigError,
    DataParallelTrainer,
    FailureConfig,
    HangError,
    RunConfig,
    ScalingConfig,
    StorageError,
    TrainingFailedError,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def fit(fn, storage, workers=2, config=None, name="run", scaling=None, **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=scaling or ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


def wait_for(condition, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_workers_are_ray_actors_with_ranks_reports_and_history(storage):
    def loop(config):
        import ray

        ctx = train.get_context()
        for step in range(config["steps"]):
            train.report(
                {
                    "step": step,
                    "rank": ctx.get_world_rank(),
                    "local": ctx.get_local_rank(),
                    "node": ctx.get_node_rank(),
                    "local_size": ctx.get_local_world_size(),
                    "pid": os.getpid(),
                    "actor": ray.get_runtime_context().get_actor_id(),
                }
            )
        return f"rank {ctx.get_world_rank()} done"

    result = fit(loop, storage, config={"steps": 300})  # engine=None: Ray is initialised
    assert list(result.metrics_dataframe["step"]) == list(range(300))
    ranks = result.all_ranks_metrics_dataframe
    assert len(ranks) == 600
    last = ranks[ranks["step"] == 299].sort_values("rank")
    assert list(last["local"]) == [0, 1] and set(last["node"]) == {0}
    assert set(last["local_size"]) == {2}
    assert all(last["actor"]) and len(set(last["actor"])) == 2
    assert len(set(last["pid"]) | {os.getpid()}) == 3
    assert result.return_value == "rank 0 done"


def test_report_does_not_wait_for_a_slow_driver(storage):
    class SlowDriver(Callback):
        def after_report(self, run_context, metrics, checkpoint):
            time.sleep(0.1)

    def loop():
        start = time.perf_counter()
        for step in range(20):
            train.report({"step": step})
        return time.perf_counter() - start

    result = fit(loop, storage, callbacks=[SlowDriver()])
    assert result.return_value < 0.5  # the driver needs >= 2 s to take these 20 rounds
    assert len(result.metrics_dataframe) == 20


def test_every_rank_s_checkpoint_part_is_merged_into_one_checkpoint(storage):
    def loop():
        rank = train.get_context().get_world_rank()
        for step in range(2):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, f"part_{rank}"), "w") as f:
                    f.write(f"{step}")
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        assert train.get_checkpoint() is not None

    result = fit(loop, storage)
    assert os.path.basename(result.checkpoint.path) == "checkpoint_000001"
    assert sorted(os.listdir(result.checkpoint.path)) == ["part_0", "part_1"]
    with open(os.path.join(result.checkpoint.path, "part_1")) as f:
        assert f.read() == "1"


def test_an_exception_in_one_rank_names_it_and_stops_the_others(storage, tmp_path):
    pid_file = tmp_path / "rank0.pid"

    def loop(config):
        if train.get_context().get_world_rank() == 0:
            with open(config["pid_file"] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(config["pid_file"] + ".tmp", config["pid_file"])
            time.sleep(60)
        while not os.path.exists(config["pid_file"]):
            time.sleep(0.005)
        raise ValueError("bad batch on rank 1")

    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage, config={"pid_file": str(pid_file)})
    failure = info.value.worker_failures[1]
    assert (failure.type_name, failure.message) == ("ValueError", "bad batch on rank 1")
    assert "raise ValueError" in failure.traceback
    assert list(info.value.worker_failures) == [1]
    assert "[rank 1] ValueError: bad batch on rank 1" in str(info.value)
    rank0_pid = int(pid_file.read_text())
    wait_for(lambda: not psutil.pid_exists(rank0_pid), 5, "rank 0's actor to be killed")


def test_a_dead_actor_is_a_failure_naming_the_rank_and_node(storage):
    def loop():
        if train.get_context().get_world_rank() == 1:
            os._exit(3)
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage)
    assert time.monotonic() - start < 30
    assert list(info.value.worker_failures) == [1]
    failure = info.value.worker_failures[1]
    assert failure.type_name == "RayWorkerDied"
    assert "the Ray actor of rank 1" in failure.message and "on node" in failure.message
    assert failure.pid is not None and failure.host


def test_a_hung_rank_is_named_with_every_rank_s_stack(storage):
    def stuck_in_user_code():
        time.sleep(1000)

    def loop():
        if train.get_context().get_world_rank() == 1:
            stuck_in_user_code()
        for step in range(1000):
            train.report({"step": step})
            time.sleep(0.05)

    with pytest.raises(HangError) as info:
        fit(loop, storage, failure_config=FailureConfig(hang_timeout_s=2))
    message = str(info.value)
    assert list(info.value.worker_failures) == [1]
    assert "in stuck_in_user_code" in message and f'File "{__file__}"' in message
    assert "--- rank 1 ---" in message


def test_output_is_prefixed_with_the_rank_and_written_to_per_rank_logs(storage, capfd):
    def loop():
        rank = train.get_context().get_world_rank()
        print(f"hello from python {rank}")
        print(f"warning on stderr {rank}", file=sys.stderr)
        os.write(1, f"raw fd write {rank}\n".encode())
        os.write(1, f"no newline at the end {rank}".encode())

    result = fit(loop, storage)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank{rank}]: hello from python {rank}" in out
        assert f"[rank{rank}]: raw fd write {rank}" in out
        assert f"[rank{rank}]: no newline at the end {rank}" in out
        assert f"[rank{rank}]: warning on stderr {rank}" in err
        with open(os.path.join(result.path, "logs", f"rank_{rank}.log")) as f:
            log = f.read()
        assert f"hello from python {rank}\n" in log and f"warning on stderr {rank}\n" in log
    assert "pid=" not in out + err  # not Ray's own "(PhalanxWorker pid=...)" form
    assert ":actor_name:" not in out + err


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

        wait_for(arrived, timeout_s=60, what="the prompt and the bar")
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
        assert time.monotonic() - start < 2.0


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
        wait_for(lambda: "Waiting" in caplog.text, 20, "the waiting message")
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
