"""The local process engine, end to end with real worker processes: what only it does (the
socket's sender thread, same-filesystem moves, this machine's resources, a killed driver). What
every engine does: tests/engines/test_contract.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest
from _helpers import wait_until

import phalanx as train
from phalanx import (
    Checkpoint,
    ConfigError,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
)

pytestmark = pytest.mark.slow


def fit(fn, storage, workers=2, config=None, name="run", **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


class HoldFirstRound(train.Callback):
    """Holds the driver in its first round's callback until every rank has made all of its
    reports (a marker file per rank): a report() that waited for the driver would never get
    there, and the wait would time out."""

    def __init__(self, done_dir, ranks):
        self.done_dir, self.ranks, self.held = done_dir, ranks, False

    def after_report(self, run_context, metrics, checkpoint):
        if not self.held:
            self.held = True
            wait_until(lambda: len(os.listdir(self.done_dir)) == self.ranks, 60, "every report")


def test_reports_larger_than_the_socket_buffer_keep_their_order_and_never_block(storage, tmp_path):
    """A report the socket cannot take at once goes to the sender thread; the small reports
    after it wait their turn (never overtake it), and report() does not wait for the driver."""
    done = tmp_path / "done"
    done.mkdir()

    def loop(config):
        for step in range(60):
            blob = "x" * (4 << 20) if step % 20 == 0 else ""  # 4 MiB, beyond any socket buffer
            train.report({"step": step, "blob": blob})
        rank = train.get_context().get_world_rank()
        with open(os.path.join(config["done"], str(rank)), "w"):
            pass

    result = fit(
        loop, storage, config={"done": str(done)}, callbacks=[HoldFirstRound(str(done), 2)]
    )
    frame = result.metrics_dataframe
    assert list(frame["step"]) == list(range(60))
    assert [len(b) for b in frame["blob"]] == [4 << 20 if s % 20 == 0 else 0 for s in range(60)]


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
    assert time.monotonic() - start < 5.0  # no worker was started: that waits for a timeout


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


@contextlib.contextmanager
def driver_with_two_workers(
    tmp_path, timeout_s: float
) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """DRIVER in its own process, once both of its workers have started (``timeout_s`` at most):
    the driver and the workers' pids. The driver is killed on the way out if it still runs."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    driver = subprocess.Popen([sys.executable, str(script), str(pids_dir), str(tmp_path / "runs")])
    try:
        wait_until(lambda: len(os.listdir(pids_dir)) == 2, timeout_s, "both workers to start")
        yield driver, [int(name.split("_")[1]) for name in os.listdir(pids_dir)]
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()


def test_killing_the_driver_leaves_no_worker_alive(tmp_path):
    with driver_with_two_workers(tmp_path, 30) as (driver, pids):
        driver.kill()
        driver.wait()
        # A worker outliving its driver lives on for good: any bound catches that.
        wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10.0, "workers to die")


class Continue(train.Callback):
    """After the failed attempt (its workers parked or stopped): SIGCONT the fork server the
    killed rank stopped."""

    def __init__(self, log):
        self.log = log

    def after_exception(self, run_context, worker_exceptions):
        with open(os.path.join(self.log, "server")) as f:
            os.kill(int(f.read()), signal.SIGCONT)


def test_a_rank_killed_before_its_server_reaps_it_is_lost_and_the_survivor_kept(storage, tmp_path):
    """The survivor's error from its all-reduce with a killed rank can reach the driver before
    the fork server has reaped that rank and said so (here the server is held stopped from the
    kill until the failed attempt was handled): the rank is dead all the same (a zombie), so
    in-place recovery keeps the survivor's process and replaces only the lost rank; taken as
    alive, "nobody was lost" replaced both."""
    from phalanx.torch import TorchTrainer

    def loop(config):
        import torch
        import torch.distributed as dist

        ctx = train.get_context()
        rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
        with open(os.path.join(config["log"], f"{attempt}-{rank}"), "w") as f:
            f.write(str(os.getpid()))
        for step in range(3):
            if (rank, attempt, step) == (1, 0, 1):
                with open(os.path.join(config["log"], "server"), "w") as f:
                    f.write(str(os.getppid()))
                os.kill(os.getppid(), signal.SIGSTOP)  # no reaping, no exit notice
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(torch.ones(1))
            train.report({"step": step})

    log = str(tmp_path)
    result = TorchTrainer(
        loop,
        train_loop_config={"log": log},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="zombie",
            storage_path=storage,
            failure_config=train.FailureConfig(max_failures=1),
            callbacks=[Continue(log)],
        ),
    ).fit()
    assert result.error is None

    def pid(attempt, rank):
        with open(os.path.join(log, f"{attempt}-{rank}")) as f:
            return int(f.read())

    assert pid(1, 0) == pid(0, 0)  # the survivor's process was kept
    assert pid(1, 1) != pid(0, 1)
