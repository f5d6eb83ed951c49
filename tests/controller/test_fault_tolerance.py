"""Failures, retries, hangs, preemption, driver crashes and Ctrl-C, on real worker processes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from _helpers import ctrl_c_default, free_port, wait_until

import phalanx as train
from phalanx import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    HangError,
    PreemptionError,
    RunConfig,
    ScalingConfig,
)
from phalanx._internal.controller.watchdog import innermost_user_frame, roll_call

pytestmark = pytest.mark.slow
try:  # only the tests that train a model need torch; Ctrl-C, SIGTERM, crashes and retries do not
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install phalanx[torch])")


def _warm_torch() -> None:
    """torch imports ~800 modules lazily on the first optimizer step (seconds). Doing it once here,
    in the driver, lets every forked worker inherit them instead of importing them again."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 1)).sum().backward()
    optimizer.step()


if torch is not None:
    _warm_torch()


def fit(fn, storage, workers=2, config=None, name="run", engine=None, **failure):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine=engine),
        run_config=RunConfig(
            name=name, storage_path=storage, failure_config=FailureConfig(**failure)
        ),
    ).fit()


def init_gloo(config):
    import torch.distributed as dist

    ctx = train.get_context()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(config["ports"][ctx.get_attempt()])
    dist.init_process_group("gloo", rank=ctx.get_world_rank(), world_size=ctx.get_world_size())
    return dist


# -- hangs ----------------------------------------------------------------------------------------


def hanging_loop(config):
    dist = init_gloo(config)
    t = torch.ones(1)
    for step in range(1000):
        if train.get_context().get_world_rank() == 2 and step == 3:
            time.sleep(1000)  # rank 2 never reaches the all_reduce
        dist.all_reduce(t)
        train.report({"step": step})


@needs_torch
def test_a_rank_stuck_outside_a_collective_is_named_with_every_stack(storage):
    start = time.monotonic()
    with pytest.raises(HangError) as info:
        fit(hanging_loop, storage, workers=3, config={"ports": [free_port()]}, hang_timeout_s=2)
    assert time.monotonic() - start < 2 + 10
    message = str(info.value)
    assert "made no progress" in message and "hang_timeout_s" in message
    assert "-> rank 2 is not where the others are." in message
    with open(__file__) as source:
        stuck = next(n for n, line in enumerate(source, 1) if "rank 2 never reaches" in line)
    assert f'[rank 2] File "{__file__}", line {stuck} in hanging_loop' in message
    assert f'File "{__file__}", line' in message
    assert set(info.value.worker_failures) == {0, 1, 2}
    assert all(f.kind == "hang" for f in info.value.worker_failures.values())


def test_roll_call_groups_ranks_by_frame():
    stuck = 'Thread 0x1 (most recent call first):\n  File "t.py", line 9 in loop\n  File "s.py", line 1 in run_train_fn\n'
    waiting = 'Thread 0x1 (most recent call first):\n  File "t.py", line 12 in loop\n  File "s.py", line 1 in run_train_fn\n'
    assert innermost_user_frame(stuck) == 'File "t.py", line 9 in loop'
    text = roll_call({0: waiting, 1: waiting, 2: stuck, 3: waiting})
    assert '[rank 2] File "t.py", line 9 in loop' in text
    assert '[rank 0, 1, 3] File "t.py", line 12 in loop' in text
    assert "-> rank 2 is not where the others are." in text


def test_the_watchdog_is_off_by_default_and_quiet_for_progressing_ranks(storage):
    def loop():
        for step in range(25):
            time.sleep(0.1)
            train.report({"step": step})

    result = fit(loop, storage, hang_timeout_s=1.5)  # runs 2.5 s, never 1.5 s without a report
    assert len(result.metrics_dataframe) == 25


# -- preemption -----------------------------------------------------------------------------------


def preemptible_loop(config):
    ctx = train.get_context()
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        time.sleep(0.02)
        if ctx.get_world_rank() == 1 and step == config["sigterm_at"] and ctx.get_attempt() == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # what a spot reclaim does
        preempting = train.get_preemption_info() is not None
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0 and (step % 10 == 0 or preempting):
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                checkpoint = Checkpoint.from_directory(d)
            train.report({"step": step, "preempting": preempting}, checkpoint=checkpoint)


def test_sigterm_saves_a_just_in_time_checkpoint_and_uses_the_preemption_budget(storage):
    result = fit(preemptible_loop, storage, config={"steps": 30, "sigterm_at": 5}, max_failures=0)
    df = result.metrics_dataframe
    jit = df[df["preempting"] & df["checkpoint_dir_name"].notna()]
    assert len(jit) >= 1 and int(jit["step"].iloc[-1]) % 10 != 0
    stop_step = int(jit["step"].iloc[-1])
    steps = list(df["step"])
    # the second attempt continues right after the just-in-time checkpoint
    assert steps == sorted(steps) and steps == list(range(30))
    assert stop_step >= 5
    snapshot = json.loads(
        Path(os.path.join(result.path, "checkpoint_manager_snapshot.json")).read_text()
    )
    assert [a["outcome"] for a in snapshot["attempts"]] == ["preempted", "finished"]
    assert result.attempts == 2


def test_preemptions_beyond_their_budget_raise_preemption_error(storage):
    with pytest.raises(PreemptionError) as info:
        fit(
            preemptible_loop,
            storage,
            config={"steps": 30, "sigterm_at": 5},
            max_preemption_failures=0,
        )
    assert {f.kind for f in info.value.worker_failures.values()} == {"preempted"}
    assert info.value.result.checkpoint is not None


# -- kill -9 at a random step, many seeds ---------------------------------------------------------


def deterministic_ddp_loop(config):
    dist = init_gloo(config)
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)  # gradients averaged by hand: DDP's first use costs seconds
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
    for step in range(start, config["steps"]):
        if (rank, step) == tuple(config["kill"]) and ctx.get_attempt() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(8, 4, generator=g)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "step": step,
                    },
                    os.path.join(d, "state.pt"),
                )
            train.report(
                {"step": step, "loss": loss.item()},
                checkpoint=Checkpoint.from_directory(d) if rank == 0 else None,
            )
    dist.destroy_process_group()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


@needs_torch
def test_kill_9_at_random_steps_resumes_to_the_same_model(storage):
    steps = 12
    reference = fit(
        deterministic_ddp_loop,
        storage,
        name="reference",
        config={"steps": steps, "kill": [-1, -1], "ports": [free_port()]},
    )
    rng = random.Random(1234)
    for seed in range(4):
        kill = [rng.randrange(2), rng.randrange(1, steps)]
        result = fit(
            deterministic_ddp_loop,
            storage,
            name=f"seed{seed}",
            max_failures=1,
            config={"steps": steps, "kill": kill, "ports": [free_port(), free_port()]},
        )
        assert result.attempts == 2, kill
        assert result.return_value == pytest.approx(reference.return_value, abs=1e-6), kill
        kept = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_0"))
        assert kept == [f"checkpoint_{i:06d}" for i in range(steps)], kill  # none lost
        assert list(result.metrics_dataframe["step"])[-1] == steps - 1


def test_retrying_forever_eventually_succeeds(storage):
    def loop():
        if train.get_context().get_attempt() < 3:
            raise RuntimeError("flaky")
        train.report({"ok": 1})

    result = fit(loop, storage, workers=1, engine="thread", max_failures=-1)
    assert result.attempts == 4 and result.metrics == {"ok": 1}


# -- the driver: crash and resume, Ctrl-C ---------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import os, sys, tempfile, time
    import phalanx as train
    from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config):
        start = 0
        if ckpt := train.get_checkpoint():
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "step")).read()) + 1
        for step in range(start, 20):
            time.sleep(config["delay"])
            with open(os.path.join(config["dir"], f"pid_{os.getpid()}"), "w"):
                pass
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "step"), "w").write(str(step))
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))

    result = DataParallelTrainer(
        loop, train_loop_config={"dir": sys.argv[1], "delay": float(sys.argv[3])},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="crashy", storage_path=sys.argv[2]),
    ).fit()
    print("FINAL", result.metrics["step"])
    """
)


@pytest.fixture
def driver_script(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    (tmp_path / "pids").mkdir()
    return script


def start_driver(script, tmp_path, delay):
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "pids"), str(tmp_path / "runs"), str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,
    )


def worker_pids(tmp_path):
    return [int(n.split("_")[1]) for n in os.listdir(tmp_path / "pids")]


def test_a_crashed_driver_is_resumed_by_running_it_again(driver_script, tmp_path):
    run_dir = tmp_path / "runs" / "crashy"
    driver = start_driver(driver_script, tmp_path, 0.05)
    try:
        wait_until(lambda: (run_dir / "checkpoint_000005").exists(), 30, "a few checkpoints")
        driver.kill()
        driver.communicate()  # closes its pipes too
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()  # closes its pipes too
    wait_until(
        lambda: not any(psutil.pid_exists(p) for p in worker_pids(tmp_path)), 10, "workers to stop"
    )
    os.makedirs(run_dir / "checkpoint_000099")  # as if committed right before the crash
    again = start_driver(driver_script, tmp_path, 0.0)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert "FINAL 19" in out
    history = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert history[-1] == 19 and set(history) == set(range(20))  # continued, not overwritten
    assert not (run_dir / "checkpoint_000099").exists()
    snapshot = json.loads(Path(run_dir / "checkpoint_manager_snapshot.json").read_text())
    assert len(snapshot["attempts"]) == 2 and snapshot["attempts"][1]["outcome"] == "finished"


def test_ctrl_c_stops_every_worker_and_keeps_committed_checkpoints(driver_script, tmp_path):
    run_dir = tmp_path / "runs" / "crashy"
    driver = start_driver(driver_script, tmp_path, 0.5)
    try:
        wait_until(lambda: (run_dir / "checkpoint_000002").exists(), 30, "a few checkpoints")
        pids = worker_pids(tmp_path)
        driver.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, err = driver.communicate(timeout=10)
        assert time.monotonic() - start < 5.0  # not after the ~8 s of rounds left
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()  # closes its pipes too
    assert "KeyboardInterrupt" in err and driver.returncode != 0
    assert not any(psutil.pid_exists(p) for p in pids)
    snapshot = json.loads(Path(run_dir / "checkpoint_manager_snapshot.json").read_text())
    assert snapshot["latest"] is not None
    assert (run_dir / snapshot["latest"] / "step").exists()
    assert snapshot["attempts"][-1]["outcome"] == "interrupted"


# -- restarts are fast: the fork server preloads what the backend names --------------------------


class PreloadingConfig(train.BackendConfig):
    @property
    def preload_modules(self):
        return ("wave",)  # stdlib, imported by nothing else here


def fit_preloading(loop, storage, max_failures):
    """``loop`` on one local worker whose backend names ``wave`` to preload."""
    return DataParallelTrainer(
        loop,
        backend_config=PreloadingConfig(),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            storage_path=storage, failure_config=FailureConfig(max_failures=max_failures)
        ),
    ).fit()


def test_workers_of_a_retry_inherit_the_backends_preloaded_modules(storage):
    def loop():
        train.report({"preloaded": "wave" in sys.modules})
        if train.get_context().get_attempt() == 0:
            raise RuntimeError("fail once")

    assert "wave" not in sys.modules
    result = fit_preloading(loop, storage, max_failures=1)
    # the retry (no checkpoint: it starts over) supersedes attempt 1's row in the trajectory
    assert list(result.all_ranks_metrics_dataframe["preloaded"]) == [False, True]
    assert list(result.metrics_dataframe["preloaded"]) == [True]


def test_a_run_that_cannot_retry_a_failure_spends_no_cpu_on_preloading(storage):
    """max_failures=0 (the default): nothing in the driver's machine imports the backend's
    modules while the workers train (B10). A restart after a preemption, which the preemption
    budget still allows, imports them in its own workers."""

    def loop():
        if train.get_context().get_attempt() == 0:
            time.sleep(1.0)  # the window in which a preloading server would import
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption: retried with max_failures=0
            for _ in range(400):  # the first report() after the notice stops this rank
                train.report({"preloaded": "wave" in sys.modules, "try": 0})
                time.sleep(0.05)
        train.report({"preloaded": "wave" in sys.modules, "try": 1})

    result = fit_preloading(loop, storage, max_failures=0)
    assert result.metrics["try"] == 1 and result.attempts == 2
    assert not result.metrics["preloaded"]
    assert not any(result.all_ranks_metrics_dataframe["preloaded"])
    assert "wave" not in sys.modules
