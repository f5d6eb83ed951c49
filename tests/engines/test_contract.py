"""The engine contract: what a user sees from fit() on every engine (thread, local, Ray).

Each test runs once per ``engine`` case (tests/engines/conftest.py). Where a behaviour needs a
worker of its own process (its own output, a signal, a pid), the thread engine is skipped with
the reason; everything else holds on every engine alike. Engine-specific behaviour stays in
tests/engines/test_local_engine.py and tests/ray/test_ray_engine.py.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

import psutil
import pytest
from _helpers import wait_until
from _leaks import children, phalanx_threads, ray_tolerant

import phalanx as train
from phalanx import (
    Callback,
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    HangError,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)

pytestmark = pytest.mark.slow


def fit(fn, storage, engine, workers=2, config=None, name="run", **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine=engine.engine),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


def test_every_rank_sees_its_ranks_and_rank_0_returns(storage, engine):
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

    result = fit(loop, storage, engine, workers=3)
    ranks = result.all_ranks_metrics_dataframe.sort_values("rank")
    assert list(ranks["rank"]) == [0, 1, 2] and list(ranks["local"]) == [0, 1, 2]
    assert set(ranks["node"]) == {0} and set(ranks["size"]) == {3}
    assert set(ranks["local_size"]) == {3} and set(ranks["name"]) == {"run"}
    assert result.return_value == "rank 0 done"
    if engine.processes:
        assert len(set(ranks["pid"]) | {os.getpid()}) == 4


# Back to back, so they reach the driver in batches (a Ray drain's answer carries every message
# since the last one): 300 cover that; 1000 took 5 s on Ray under load and proved no more.
REPORTS = 300


def test_many_reports_arrive_in_order_with_every_rank_s_history(storage, engine):
    def loop():
        rank = train.get_context().get_world_rank()
        for step in range(REPORTS):
            train.report({"step": step, "rank": rank})

    result = fit(loop, storage, engine)
    assert list(result.metrics_dataframe["step"]) == list(range(REPORTS))
    ranks = result.all_ranks_metrics_dataframe
    for rank in (0, 1):
        assert list(ranks[ranks["rank"] == rank]["step"]) == list(range(REPORTS))


def test_report_does_not_wait_for_a_slow_driver(storage, engine, tmp_path):
    done = tmp_path / "done"
    done.mkdir()

    class HeldDriver(Callback):
        """Holds the driver in the first round until every rank made all its reports: a
        report() that waited for the driver would never get there (the wait times out)."""

        held = False

        def after_report(self, run_context, metrics, checkpoint):
            if not self.held:
                self.held = True
                wait_until(lambda: len(os.listdir(done)) == 2, 60, "every rank's 20 reports")

    def loop(config):
        for step in range(20):
            train.report({"step": step})
        with open(os.path.join(config["done"], str(train.get_context().get_world_rank())), "w"):
            pass

    result = fit(loop, storage, engine, config={"done": str(done)}, callbacks=[HeldDriver()])
    assert len(result.metrics_dataframe) == 20


def test_output_is_prefixed_with_the_rank_and_written_to_per_rank_logs(
    storage, process_engine, capfd
):
    def loop():
        rank = train.get_context().get_world_rank()
        print(f"hello from python {rank}")
        print(f"warning on stderr {rank}", file=sys.stderr)
        os.write(1, f"raw fd write {rank}\n".encode())
        os.write(1, f"no newline at the end {rank}".encode())

    result = fit(loop, storage, process_engine)
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


def test_a_checkpoint_merges_every_rank_s_part_and_is_visible_only_when_complete(
    storage, engine, tmp_path
):
    go = tmp_path / "go"

    def loop(config):
        rank = train.get_context().get_world_rank()
        for step in range(2):
            if rank == 1 and step == 0:
                while not os.path.exists(config["go"]):
                    time.sleep(0.01)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, f"part_{rank}"), "w") as f:
                    f.write(f"{step}")
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            assert train.get_checkpoint() is not None

    run_dir = os.path.join(storage, "atomic")
    seen_early = []

    def watch():
        staged = os.path.join(run_dir, ".staging", "checkpoint_000000.0", "part_0")
        try:
            wait_until(lambda: os.path.exists(staged), 60, "rank 0's staged part")
            seen_early.append(os.path.exists(os.path.join(run_dir, "checkpoint_000000")))
        finally:
            go.touch()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = fit(loop, storage, engine, name="atomic", config={"go": str(go)})
    finally:
        go.touch()
        watcher.join()
    assert seen_early == [False]
    assert os.path.basename(result.checkpoint.path) == "checkpoint_000001"
    assert sorted(os.listdir(result.checkpoint.path)) == ["part_0", "part_1"]
    with open(os.path.join(result.checkpoint.path, "part_1")) as f:
        assert f.read() == "1"


def test_an_exception_ends_fit_quickly_naming_the_rank_and_stops_the_others(
    storage, engine, tmp_path
):
    pid_file, stop, waited = tmp_path / "rank0.pid", tmp_path / "stop", tmp_path / "rank0.waited"

    def loop(config):
        if train.get_context().get_world_rank() == 0:
            with open(config["pid_file"] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(config["pid_file"] + ".tmp", config["pid_file"])
            deadline = time.monotonic() + 60
            # A process is killed here; a thread cannot be, so the test lets it go.
            while not os.path.exists(config["stop"]) and time.monotonic() < deadline:
                time.sleep(0.005)
            with open(config["waited"], "w"):  # rank 0 left its wait: fit() waited for it
                pass
            return
        while not os.path.exists(config["pid_file"]):
            time.sleep(0.005)
        raise ValueError("bad batch on rank 1")

    config = {"pid_file": str(pid_file), "stop": str(stop), "waited": str(waited)}
    try:
        with pytest.raises(TrainingFailedError) as info:
            fit(loop, storage, engine, config=config)
        # Failed fast: while rank 0 still waited for ``stop`` (written only now), not after it
        assert not waited.exists()
    finally:
        stop.touch()
    failure = info.value.worker_failures[1]
    assert (failure.type_name, failure.message) == ("ValueError", "bad batch on rank 1")
    assert "raise ValueError" in failure.traceback
    assert list(info.value.worker_failures) == [1]
    assert "[rank 1] ValueError: bad batch on rank 1" in str(info.value)
    rank0_pid = int(pid_file.read_text())

    def rank0_gone():
        return not psutil.pid_exists(rank0_pid) or psutil.Process(rank0_pid).status() == "zombie"

    if engine.engine == "local":  # killed before fit() returns
        assert rank0_gone()
    elif engine.engine == "ray":  # ray.kill() is asynchronous
        wait_until(rank0_gone, 5, "rank 0's actor to be killed")


def test_a_worker_killed_by_a_signal_is_a_failure_naming_its_rank_and_pid(storage, process_engine):
    def loop():
        if train.get_context().get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage, process_engine)
    assert time.monotonic() - start < 30
    assert list(info.value.worker_failures) == [1]
    failure = info.value.worker_failures[1]
    assert failure.pid is not None
    if process_engine.engine == "ray":
        assert failure.type_name == "RayWorkerDied"
        assert "the Ray actor of rank 1" in failure.message and "on node" in failure.message
        assert failure.host
    else:
        assert failure.kind == "signal" and failure.signal == signal.SIGKILL
        assert f"killed by signal 9 (SIGKILL) pid={failure.pid}" in str(info.value)


def stuck_in_user_code():
    time.sleep(1000)


def test_a_hung_rank_is_named_with_every_rank_s_stack(storage, process_engine):
    def loop():
        if train.get_context().get_world_rank() == 1:
            stuck_in_user_code()
        for step in range(1000):
            train.report({"step": step})
            time.sleep(0.05)

    with pytest.raises(HangError) as info:
        fit(loop, storage, process_engine, failure_config=FailureConfig(hang_timeout_s=2))
    message = str(info.value)
    assert list(info.value.worker_failures) == [1]
    assert "in stuck_in_user_code" in message and f'File "{__file__}"' in message
    assert "--- rank 1 ---" in message


def test_a_retry_resumes_from_the_last_committed_checkpoint(storage, engine):
    def loop():
        ctx = train.get_context()
        start = 0
        if (checkpoint := train.get_checkpoint()) is not None:
            with open(os.path.join(checkpoint.path, "step")) as f:
                start = int(f.read()) + 1
        for step in range(start, 4):
            if ctx.get_attempt() == 0 and step == 2 and ctx.get_world_rank() == 1:
                raise RuntimeError("lost rank 1")
            with tempfile.TemporaryDirectory() as d:
                checkpoint = None
                if ctx.get_world_rank() == 0:  # Ray's pattern: rank 0 saves, the others pass None
                    with open(os.path.join(d, "step"), "w") as f:
                        f.write(str(step))
                    checkpoint = Checkpoint.from_directory(d)
                train.report({"step": step}, checkpoint=checkpoint)

    result = fit(loop, storage, engine, failure_config=FailureConfig(max_failures=1))
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [0, 1, 2, 3]
    first, second = frame["_phalanx_attempt"].iloc[0], frame["_phalanx_attempt"].iloc[2]
    assert list(frame["_phalanx_attempt"]) == [first, first, second, second] and second == first + 1
    with open(os.path.join(result.checkpoint.path, "step")) as f:
        assert f.read() == "3"


def test_fit_leaves_nothing_running(storage, engine):
    children_before, threads_before = set(children()), phalanx_threads()

    def left_running():
        left = {pid: name for pid, name in children().items() if pid not in children_before}
        return {pid: name for pid, name in left.items() if ray_tolerant(name)}

    fit(lambda: train.report({"a": 1}), storage, engine)
    assert phalanx_threads() - threads_before == set()
    if engine.engine == "ray":  # ray.kill() is asynchronous: the actor's process ends soon after
        wait_until(lambda: not left_running(), 5, "the actors' processes to end")
    assert left_running() == {}
