"""A round every rank reported survives a rank that fails right after it, on real processes.

Ray's ``report()`` is a barrier; phalanx's is not, so the driver gives the other ranks a bounded
grace to reach the failed rank's last round before it tears the attempt down.
"""

from __future__ import annotations

import math
import os
import signal
import tempfile
import time

import psutil
import pytest

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

pytestmark = pytest.mark.slow


def wait_for(condition, what, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def loop(config):
    """Rank 1 raises right after its report of round k, while rank 0 is still writing its
    checkpoint for round k (rank 0 starts writing only once rank 1 has raised)."""
    context = train.get_context()
    rank, first = context.get_world_rank(), context.get_attempt() == 0
    k, start = config["k"], 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        if rank == 1:
            loss = math.nan if first and step == k else 1.0 / (step + 1)
            train.report({"step": step, "loss": loss})
            if first and step == k:
                with open(config["marker"] + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(config["marker"] + ".tmp", config["marker"])
                if config.get("kill"):  # a lost machine: nothing runs after report() returns
                    os.kill(os.getpid(), signal.SIGKILL)
                raise FloatingPointError("loss is NaN")
            continue
        with tempfile.TemporaryDirectory() as d:
            if first and step == k:
                # Round k's checkpoint is written only once rank 1 has reported round k and
                # failed (its process gone, when killed). Which of the two the driver sees first
                # is the processes' own order, over 20 runs; each order is pinned step by step
                # in tests/controller/test_drain_order.py.
                wait_for(lambda: os.path.exists(config["marker"]), "rank 1's failure")
                if config.get("kill"):
                    with open(config["marker"]) as f:
                        pid = int(f.read())
                    wait_for(lambda p=pid: gone(p), "rank 1's process to be gone")
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step, "loss": 1.0 / (step + 1)}, Checkpoint.from_directory(d))


def fit_failing_once(tmp_path, repetition, k, steps, kill=False):
    """One run of ``loop`` in which rank 1 fails (raises, or is SIGKILLed when ``kill``) right
    after its report of round k; the retry must start at round k + 1."""
    result = DataParallelTrainer(
        loop,
        train_loop_config={
            "k": k,
            "steps": steps,
            "marker": str(tmp_path / f"m{repetition}"),
            "kill": kill,
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=f"r{repetition}",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.attempts == 2
    rows = result.all_ranks_metrics_dataframe
    retry = rows[rows["_phalanx_attempt"] == 2]
    assert retry["step"].min() == k + 1, f"repetition {repetition} lost round {k}"
    return result


def test_a_failure_right_after_a_report_loses_no_round_in_20_runs(tmp_path):
    k, steps = 2, 4
    for repetition in range(20):
        result = fit_failing_once(tmp_path, repetition, k, steps)
        rows = result.all_ranks_metrics_dataframe
        failed = rows[(rows["_phalanx_attempt"] == 1) & (rows["rank"] == 1)]
        assert math.isnan(failed["loss"].iloc[-1])  # the failing rank's last report is kept
        assert list(rows[rows["loss"].isna()]["step"]) == [k]  # and it is the only NaN
        frame = result.metrics_dataframe
        assert list(frame["step"]) == list(range(steps))
        assert list(frame["training_iteration"]) == list(range(1, steps + 1))
        assert list(frame["_phalanx_attempt"]) == [1] * (k + 1) + [2] * (steps - k - 1)
        assert result.checkpoint.path.endswith(f"checkpoint_{steps - 1:06d}")


def test_a_rank_killed_right_after_its_report_loses_no_round_in_20_runs(tmp_path):
    """``report()`` has handed the report to the kernel when it returns: a SIGKILL right after
    it (a lost machine, an OOM kill) cannot take the report back."""
    k, steps = 2, 4
    for repetition in range(20):
        result = fit_failing_once(tmp_path, repetition, k, steps, kill=True)
        assert "SIGKILL" in result.attempt_errors[0]
        assert list(result.metrics_dataframe["step"]) == list(range(steps))
