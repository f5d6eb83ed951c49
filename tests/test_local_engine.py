"""The local process engine, end to end with real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

import phalanx as train
from phalanx import (
    Callback,
    Checkpoint,
    ConfigError,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)

pytestmark = pytest.mark.slow


def fit(fn, storage, workers=2, config=None, name="run", **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


def wait_for(condition, timeout_s=10.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_workers_are_separate_processes_with_torchrun_ranks(storage):
    def loop():
        ctx = train.get_context()
        train.report(
            {
                "pid": os.getpid(),
                "rank": ctx.get_world_rank(),
                "local": ctx.get_local_rank(),
                "node": ctx.get_node_rank(),
                "size": ctx.get_world_size(),
                "local_size": ctx.get_local_world_size(),
                "name": ctx.get_experiment_name(),
            }
        )
        return f"rank {ctx.get_world_rank()} done"

    result = fit(loop, storage, workers=3)
    ranks = result.all_ranks_metrics_dataframe.sort_values("rank")
    assert list(ranks["local"]) == [0, 1, 2]
    assert (
        set(ranks["node"]) == {0} and set(ranks["size"]) == {3} and set(ranks["local_size"]) == {3}
    )
    assert len(set(ranks["pid"]) | {os.getpid()}) == 4
    assert set(ranks["name"]) == {"run"}
    assert result.return_value == "rank 0 done"


def test_output_is_prefixed_with_the_rank_and_written_to_per_rank_logs(storage, capfd):
    def loop():
        rank = train.get_context().get_world_rank()
        print(f"hello from python {rank}")
        print(f"warning on stderr {rank}", file=sys.stderr)
        os.write(1, f"raw fd write {rank}\n".encode())

    result = fit(loop, storage)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank{rank}]: hello from python {rank}" in out
        assert f"[rank{rank}]: raw fd write {rank}" in out
        assert f"[rank{rank}]: warning on stderr {rank}" in err
        with open(os.path.join(result.path, "logs", f"rank_{rank}.log")) as f:
            log = f.read()
        assert f"hello from python {rank}\n" in log and f"warning on stderr {rank}\n" in log


def test_many_reports_arrive_in_order(storage):
    def loop():
        for step in range(1000):
            train.report({"step": step})

    result = fit(loop, storage)
    assert list(result.metrics_dataframe["step"]) == list(range(1000))


def test_reports_larger_than_the_socket_buffer_keep_their_order_and_never_block(storage):
    """A report the socket cannot take at once goes to the sender thread; the small reports
    after it wait their turn (never overtake it), and report() does not wait for the driver."""

    def loop():
        start, slowest = time.perf_counter(), 0.0
        for step in range(60):
            blob = "x" * (4 << 20) if step % 20 == 0 else ""  # 4 MiB, beyond any socket buffer
            t = time.perf_counter()
            train.report({"step": step, "blob": blob})
            slowest = max(slowest, time.perf_counter() - t) if not blob else slowest
        return time.perf_counter() - start, slowest

    result = fit(loop, storage)
    frame = result.metrics_dataframe
    assert list(frame["step"]) == list(range(60))
    assert [len(b) for b in frame["blob"]] == [4 << 20 if s % 20 == 0 else 0 for s in range(60)]
    _, slowest_small = result.return_value
    assert slowest_small < 0.05  # a small report behind a queued 4 MiB one is only queued


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


def test_a_checkpoint_is_visible_only_when_every_part_is_saved(storage, tmp_path):
    go = tmp_path / "go"

    def loop(config):
        rank = train.get_context().get_world_rank()
        if rank == 1:
            while not os.path.exists(config["go"]):
                time.sleep(0.01)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"part_{rank}"), "w") as f:
                f.write("x" * 1000)
            train.report({}, checkpoint=Checkpoint.from_directory(d))

    import threading

    run_dir = os.path.join(storage, "atomic")
    seen_early = []

    def watch():
        staged = os.path.join(run_dir, ".staging", "checkpoint_000000.0", "part_0")
        wait_for(lambda: os.path.exists(staged), what="rank 0's staged part")
        seen_early.append(os.path.exists(os.path.join(run_dir, "checkpoint_000000")))
        go.touch()

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = fit(loop, storage, name="atomic", config={"go": str(go)})
    watcher.join()
    assert seen_early == [False]
    assert sorted(os.listdir(result.checkpoint.path)) == ["part_0", "part_1"]


@pytest.mark.parametrize("delete", [True, None])
def test_a_checkpoint_on_the_same_filesystem_is_moved_only_when_the_user_allows_it(storage, delete):
    def loop():
        with tempfile.TemporaryDirectory(dir=train.get_context().get_storage().storage_path) as d:
            path = os.path.join(d, "weights.bin")
            with open(path, "wb") as f:
                f.write(os.urandom(1 << 20))
            inode = os.stat(path).st_ino
            train.report({"inode": inode}, checkpoint=Checkpoint.from_directory(d),
                         delete_local_checkpoint_after_upload=delete)  # fmt: skip
            left = os.path.exists(path) and os.stat(path).st_ino
        return left

    result = fit(loop, storage, workers=1)
    committed = os.stat(os.path.join(result.checkpoint.path, "weights.bin")).st_ino
    if delete:  # a rename: the same inode, nothing left behind
        assert committed == result.metrics["inode"] and result.return_value is False
    else:  # SYNC's default: a copy; the user's file is untouched
        assert committed != result.metrics["inode"] == result.return_value


def test_an_exception_ends_fit_quickly_and_kills_the_other_ranks(storage, tmp_path):
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

    start = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage, config={"pid_file": str(pid_file)})
    assert time.monotonic() - start < 3.0  # includes start-up; the failure path itself is ms
    failure = info.value.worker_failures[1]
    assert (failure.type_name, failure.message) == ("ValueError", "bad batch on rank 1")
    assert "raise ValueError" in failure.traceback
    assert list(info.value.worker_failures) == [1]
    rank0_pid = int(pid_file.read_text())
    assert not psutil.pid_exists(rank0_pid) or psutil.Process(rank0_pid).status() == "zombie"


def test_a_worker_killed_by_a_signal_is_reported_with_rank_pid_and_signal(storage):
    def loop():
        if train.get_context().get_world_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage)
    failure = info.value.worker_failures[0]
    assert failure.kind == "signal" and failure.signal == signal.SIGKILL
    assert failure.pid is not None
    assert f"killed by signal 9 (SIGKILL) pid={failure.pid}" in str(info.value)


def test_use_gpu_without_gpus_fails_at_fit_within_a_second(storage):
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        run_config=RunConfig(storage_path=storage),
    )
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        pytest.skip("this machine has GPUs")
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"needs 2 GPU\(s\) but this machine has 0"):
        trainer.fit()
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize(
    ("resources", "match"),
    [
        ({"CPU": 10_000}, "needs 20000 CPUs"),
        ({"TPU": 1}, r"\['TPU'\]"),
        ({"memory": 2**50}, "GiB of memory"),
    ],
)
def test_resources_this_machine_cannot_give_fail_at_fit(storage, resources, match):
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker=resources),
        run_config=RunConfig(storage_path=storage),
    )
    with pytest.raises(ConfigError, match=match):
        trainer.fit()


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import phalanx as train
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config):
        with open(os.path.join(config["dir"], f"pid_{os.getpid()}"), "w"):
            pass
        time.sleep(120)

    DataParallelTrainer(loop, train_loop_config={"dir": sys.argv[1]},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(storage_path=sys.argv[2])).fit()
    """
)


def test_killing_the_driver_leaves_no_worker_alive(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    driver = subprocess.Popen([sys.executable, str(script), str(pids_dir), str(tmp_path / "runs")])
    try:
        wait_for(lambda: len(os.listdir(pids_dir)) == 2, 30, "both workers to start")
        pids = [int(name.split("_")[1]) for name in os.listdir(pids_dir)]
        driver.kill()
        driver.wait()
        start = time.monotonic()
        wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 2.0, "workers to die")
        assert time.monotonic() - start < 2.0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_fit_leaves_no_child_process(storage):
    fit(lambda: train.report({"a": 1}), storage)
    assert [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"] == []
