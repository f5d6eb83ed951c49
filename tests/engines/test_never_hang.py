"""fit() never hangs and always says why (local engine, real processes): a dying fork server,
the hang roll call with two ranks, visible retries and their backoff, Ctrl-C and SIGTERM.

The tests shared with the Ray engine are in ``tests/engines/test_never_hang_contract.py``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
from _helpers import ctrl_c_default, free_port, wait_until

import phalanx as train
from phalanx import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    HangError,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from phalanx._internal.controller.failure_policy import BACKOFF_MAX_S, FailurePolicy
from phalanx._internal.controller.watchdog import roll_call

pytestmark = pytest.mark.slow

CONTROLLER_LOG = "phalanx._internal.controller.controller"


def fit(fn, storage, workers=2, config=None, name="run", **failure):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine="local"),
        run_config=RunConfig(
            name=name, storage_path=storage, failure_config=FailureConfig(**failure)
        ),
    ).fit()


# -- start-up failures --------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_start_server_that_died_is_a_startup_failure_that_is_retried(
    storage, method, monkeypatch
):
    monkeypatch.setenv("PHALANX_START_METHOD", method)

    def loop():
        if train.get_context().get_attempt() == 0:
            os.kill(os.getppid(), signal.SIGKILL)  # the fork/spawn server; its workers die with it
            time.sleep(60)
        train.report({"ok": 1})

    start = time.monotonic()
    result = fit(loop, storage, max_failures=2)
    assert time.monotonic() - start < 60
    assert result.metrics == {"ok": 1} and result.attempts == 3
    first, startup, last = result.attempt_errors
    assert "killed by signal 9" in (first or "")
    assert "could not be started" in (startup or "") and f"{method} server" in (startup or "")
    assert last is None


# -- the hang roll call names the rank that stopped ---------------------------------------------


def asleep_while_rank_0_waits_in_all_reduce(config):
    import torch
    import torch.distributed as dist

    ctx = train.get_context()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(config["ports"][ctx.get_attempt()])
    dist.init_process_group("gloo", rank=ctx.get_world_rank(), world_size=2)
    t = torch.ones(1)
    for step in range(1000):
        if ctx.get_world_rank() == 1 and step == 1:
            time.sleep(1000)  # rank 1 never reaches the all_reduce; rank 0 waits in it
        dist.all_reduce(t)
        train.report({"step": step})


@pytest.mark.timeout(300)
def test_the_roll_call_names_the_sleeping_rank_not_the_one_in_all_reduce_every_time(storage):
    pytest.importorskip("torch")
    # One attempt per trial: each hangs, the next starts on a fresh port. 10 of 10 and more:
    # bench/hang_roll_call.py --trials 10.
    trials = 3
    config = {"ports": [free_port() for _ in range(trials)]}
    with pytest.raises(HangError) as info:
        fit(
            asleep_while_rank_0_waits_in_all_reduce,
            storage,
            config=config,
            hang_timeout_s=2,
            max_failures=trials - 1,
        )
    errors = info.value.result.attempt_errors
    assert len(errors) == trials
    named = [e for e in errors if "-> rank 1 is not where the others are." in (e or "")]
    assert len(named) == trials, errors
    assert all("wait in a collective" in e for e in named)
    message = str(info.value)  # every rank's stack is still shown
    assert "--- rank 0 ---" in message and "--- rank 1 ---" in message
    assert "in all_reduce" in message and "in asleep_while_rank_0_waits_in_all_reduce" in message


def test_roll_call_prefers_the_rank_outside_a_collective_then_the_oldest_report():
    def stack(where):
        return (
            "Thread 0x1 (most recent call first):\n"
            f"  File {where}\n"
            '  File "/x/train.py", line 5 in loop\n'
            '  File "/p/session.py", line 1 in run_train_fn\n'
        )

    in_collective = stack('"/env/torch/distributed/distributed_c10d.py", line 2 in all_reduce')
    asleep = stack('"/x/train.py", line 9 in loop')
    assert "-> rank 1 is not where the others are." in roll_call({0: in_collective, 1: asleep})
    assert "-> rank 0 is not where" in roll_call({0: asleep, 1: in_collective})
    # No collective: the rank whose last report is clearly the oldest stopped first.
    text = roll_call({0: asleep, 1: stack('"/x/train.py", line 7 in loop')}, {0: 2.1, 1: 5.0})
    assert "-> rank 1 is not where the others are." in text and "5.0 s ago" in text


# -- retries are visible ------------------------------------------------------------------------


def fails_once_on_rank_1():
    ctx = train.get_context()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"rank_{ctx.get_world_rank()}"), "w") as f:
            f.write("weights")
        train.report({"step": 0}, checkpoint=Checkpoint.from_directory(d))
    if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1:
        raise ValueError("bad batch 7")


@pytest.mark.timeout(120)
def test_each_failed_attempt_logs_one_warning_and_every_attempt_error_is_kept(storage, caplog):
    caplog.set_level(logging.WARNING, logger=CONTROLLER_LOG)
    result = fit(fails_once_on_rank_1, storage, max_failures=1)
    warnings = [r.getMessage() for r in caplog.records if r.name == CONTROLLER_LOG]
    assert len(warnings) == 1, warnings
    assert "Attempt 1 failed (failure 1 of max_failures=1)" in warnings[0]
    assert "retrying from checkpoint checkpoint_000000" in warnings[0]
    assert "[rank 1] ValueError: bad batch 7" in warnings[0]
    assert result.error is None and result.attempts == 2
    assert "ValueError: bad batch 7" in result.attempt_errors[0]
    assert result.attempt_errors[1] is None
    reloaded = Result.from_path(result.path)
    assert reloaded.attempt_errors == result.attempt_errors


@pytest.mark.timeout(120)
def test_giving_up_is_logged_with_the_budget(storage, caplog):
    caplog.set_level(logging.WARNING, logger=CONTROLLER_LOG)

    def loop():
        raise KeyError("missing column")

    with pytest.raises(TrainingFailedError):
        fit(loop, storage, workers=1, max_failures=0)
    warnings = [r.getMessage() for r in caplog.records if r.name == CONTROLLER_LOG]
    assert len(warnings) == 1
    assert "Attempt 1 failed (failure 1 of max_failures=0); giving up" in warnings[0]
    assert "[rank 0] KeyError: 'missing column'" in warnings[0]


@pytest.mark.timeout(120)
def test_unlimited_retries_of_quick_failures_back_off_and_say_so(storage, caplog):
    caplog.set_level(logging.WARNING, logger=CONTROLLER_LOG)

    def loop():
        if train.get_context().get_attempt() < 3:
            raise RuntimeError("deterministic bug")
        train.report({"ok": 1})

    result = fit(loop, storage, workers=1, max_failures=-1)
    assert result.attempts == 4
    warnings = [r.getMessage() for r in caplog.records if r.name == CONTROLLER_LOG]
    assert [re.search(r" in ([\d.]+) s \(", w).group(1) for w in warnings] == ["0.5", "1", "2"]
    assert all("max_failures=-1 (unlimited)" in w and "doubles up to 30 s" in w for w in warnings)
    with open(os.path.join(storage, "run", "checkpoint_manager_snapshot.json")) as f:
        starts = [a["started"] for a in json.load(f)["attempts"]]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= wait for gap, wait in zip(gaps, [0.5, 1.0, 2.0])), gaps


def test_the_backoff_doubles_to_a_cap_and_resets_after_a_long_attempt():
    policy = FailurePolicy(FailureConfig(max_failures=-1))
    waits = [policy.backoff_s(False, 0.1) for _ in range(10)]
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0] and waits[-1] == BACKOFF_MAX_S
    assert policy.backoff_s(False, 3600.0) == 0.0  # it ran an hour: not a quick failure
    assert policy.backoff_s(False, 0.1) == 0.5
    assert FailurePolicy(FailureConfig(max_failures=3)).backoff_s(False, 0.1) == 0.0


# -- Ctrl-C and SIGTERM to the driver -----------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import os, sys, tempfile, time
    import phalanx as train
    from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config):
        with open(os.path.join(config["dir"], f"pid_{os.getpid()}"), "w"):
            pass
        for step in range(10_000):
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, f"step_{os.getpid()}"), "w").write(str(step))
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            time.sleep(0.1)

    def main():
        DataParallelTrainer(
            loop, train_loop_config={"dir": sys.argv[1]},
            scaling_config=ScalingConfig(num_workers=2, engine="local"),
            run_config=RunConfig(name="stopme", storage_path=sys.argv[2]),
        ).fit()

    main()
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_stop_every_worker_and_say_how_to_resume(tmp_path, sig):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pid_dir, runs = tmp_path / "pids", tmp_path / "runs"
    pid_dir.mkdir()
    driver = subprocess.Popen(
        [sys.executable, str(script), str(pid_dir), str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,
    )
    try:
        wait_until(lambda: (runs / "stopme" / "checkpoint_000001").exists(), 60, "checkpoints")
        pids = [int(n.split("_")[1]) for n in os.listdir(pid_dir)]
        assert len(pids) == 2
        driver.send_signal(sig)
        sent = time.monotonic()
        wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10, "workers to stop")
        _, err = driver.communicate(timeout=30)
        assert time.monotonic() - sent < 10
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()  # closes its pipes too
    assert driver.returncode != 0
    # phalanx's console handler (no logging configured) prefixes its lines with "[phalanx] "
    resume = [line for line in err.splitlines() if line.startswith("[phalanx] Interrupted:")]
    assert len(resume) == 1, err
    assert "checkpoint(s) kept in" in resume[0]
    assert f"RunConfig(name='stopme', storage_path='{runs}')" in resume[0]
    traceback = err[err.index("Traceback") :]
    assert traceback.rstrip().splitlines()[-1].startswith("KeyboardInterrupt"), err
    assert "phalanx/_internal" not in traceback and "main()" in traceback, traceback


def test_fit_restores_the_previous_sigterm_handler(storage):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        fit(lambda: None, storage, workers=1)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
