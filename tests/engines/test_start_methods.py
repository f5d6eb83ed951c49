"""The local engine's portable start path (``spawn``), forced on Linux, and the choice between
the two paths.

The key local-engine scenarios (output, reports, checkpoints, failures, driver death, Ctrl-C)
are imported from their own modules and run again here with ``PHALANX_START_METHOD=spawn``: the
path macOS and CUDA-initialised drivers take is tested on every CI run.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import test_local_engine as local
import test_never_hang as never_hang
from _helpers import wait_until
from test_never_hang_contract import alive

import phalanx as train
from phalanx import (
    ConfigError,
    DataParallelTrainer,
    FailureConfig,
    HangError,
    RunConfig,
    ScalingConfig,
)
from phalanx._internal.engines.local import start_method

pytestmark = pytest.mark.slow

SPAWN_SERVER = "spawn_server.py"


@pytest.fixture(autouse=True)
def spawn(monkeypatch):
    monkeypatch.setenv("PHALANX_START_METHOD", "spawn")


# -- the same scenarios as the fork path, on the spawn path -------------------------------------

# Ranks, output, reports in order, checkpoints, an exception, a killed worker and nothing left
# running: tests/engines/ runs them on the "local-spawn" EngineCase. The rest, here:
test_reports_larger_than_the_socket_buffer_keep_their_order_and_never_block = (
    local.test_reports_larger_than_the_socket_buffer_keep_their_order_and_never_block
)
test_killing_the_driver_leaves_no_worker_alive = (
    local.test_killing_the_driver_leaves_no_worker_alive
)
test_each_failed_attempt_logs_one_warning_and_every_attempt_error_is_kept = (
    never_hang.test_each_failed_attempt_logs_one_warning_and_every_attempt_error_is_kept
)
test_ctrl_c_and_sigterm_stop_every_worker_and_say_how_to_resume = (
    never_hang.test_ctrl_c_and_sigterm_stop_every_worker_and_say_how_to_resume
)


def fit(fn, storage, workers=2, config=None, **failure):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine="local"),
        run_config=RunConfig(
            name="run", storage_path=storage, failure_config=FailureConfig(**failure)
        ),
    ).fit()


def describe_worker():
    """What a worker says about how it was started (rank 0 returns it)."""
    return {
        "parent": " ".join(psutil.Process(os.getppid()).cmdline()),
        "own_session": os.getsid(0) == os.getpgid(0) == os.getpid(),
        # an interpreter of its own (a forked worker has the driver's command line)
        "fresh": "spawn_main" in " ".join(psutil.Process().cmdline()),
    }


def test_spawned_workers_are_new_interpreters_each_in_its_own_session(storage):
    def loop():
        return describe_worker()

    worker = fit(loop, storage).return_value
    assert SPAWN_SERVER in worker["parent"]
    assert worker["own_session"] and worker["fresh"]


@pytest.mark.timeout(120)
def test_a_hang_names_the_sleeping_rank_with_every_rank_s_stack(storage):
    """The hang roll call and faulthandler stacks on spawned workers. hang_timeout_s counts from
    the training call, which a spawned worker would begin with a fresh ``import torch`` (seconds
    under load): the TorchTrainer imports torch and joins the group before the clock starts,
    and the closure is pickled by value (no test module to import), so 3 s is ample."""
    pytest.importorskip("torch")
    from phalanx.torch import TorchTrainer

    def loop():
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        for step in range(1000):
            if train.get_context().get_world_rank() == 1 and step == 1:
                time.sleep(1000)  # rank 1 never reaches the all_reduce; rank 0 waits in it
            dist.all_reduce(t)
            train.report({"step": step})

    with pytest.raises(HangError) as info:
        TorchTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=2, engine="local"),
            run_config=RunConfig(
                name="run", storage_path=storage, failure_config=FailureConfig(hang_timeout_s=3)
            ),
        ).fit()
    message = str(info.value)
    assert "-> rank 1 is not where the others are." in message
    assert "--- rank 0 ---" in message and "--- rank 1 ---" in message
    assert "in all_reduce" in message


@pytest.mark.timeout(120)
def test_workers_die_with_their_spawn_server_while_the_driver_cannot_act(tmp_path):
    """The lifeline: with the driver stopped (SIGSTOP) and the spawn server SIGKILLed, nothing
    but the workers themselves can end them."""
    with local.driver_with_two_workers(tmp_path, 60) as (driver, pids):
        (server,) = {psutil.Process(pid).ppid() for pid in pids}
        assert SPAWN_SERVER in " ".join(psutil.Process(server).cmdline())
        driver.send_signal(signal.SIGSTOP)
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in pids), 10, "workers to die")


# The training function's own processes, gone after fit() on this path too: the "local-spawn"
# case of tests/engines/test_never_hang_contract.py.


# -- choosing the start method ------------------------------------------------------------------


@pytest.fixture
def cuda_initialised(monkeypatch):
    """The driver has initialised CUDA (faked: this machine has no GPU to initialise)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(start_method, "_logged", set())  # "once per process": a fresh process


def test_a_driver_that_initialised_cuda_forks_workers_from_a_fresh_server_and_says_why_once(
    storage, monkeypatch, cuda_initialised, caplog
):
    monkeypatch.delenv("PHALANX_START_METHOD")

    def loop():
        torch_preloaded = "torch" in sys.modules  # the first line: imported by the server
        import torch

        return {
            **describe_worker(),
            "parent_pid": os.getppid(),
            "torch_preloaded": torch_preloaded,
            "cuda": torch.cuda.is_initialized(),
        }

    with caplog.at_level(logging.INFO, logger="phalanx"):
        first = fit(loop, storage, workers=1).return_value
        fit(lambda: None, storage, workers=1)
    # Forked from a fresh interpreter (the fork server), not the driver, which holds CUDA.
    assert "serve_spawned" in first["parent"] and first["parent_pid"] != os.getpid()
    assert first["torch_preloaded"] and first["own_session"] and first["cuda"] is False
    why = [r.getMessage() for r in caplog.records if "CUDA is already initialised" in r.message]
    assert len(why) == 1 and "Workers start with spawn" in why[0]


CUDA_DRIVER = """
import os, sys, time
import torch
import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

torch.cuda.is_initialized = lambda: True  # as after a model was moved to the GPU

def loop(config):
    with open(os.path.join(config["dir"], f"pid_{os.getpid()}_{os.getppid()}"), "w"):
        pass
    time.sleep(120)

DataParallelTrainer(loop, train_loop_config={"dir": sys.argv[1]},
                    scaling_config=ScalingConfig(num_workers=2, engine="local"),
                    run_config=RunConfig(storage_path=sys.argv[2])).fit()
"""


def test_killing_a_cuda_initialised_driver_leaves_neither_workers_nor_fork_server(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "driver.py"
    script.write_text(CUDA_DRIVER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "PHALANX_START_METHOD"}
    command = [sys.executable, str(script), str(pids_dir), str(tmp_path / "runs")]
    driver = subprocess.Popen(command, env=environ)
    try:
        wait_until(lambda: len(os.listdir(pids_dir)) == 2, 60, "both workers to start")
        pids = [int(p) for name in os.listdir(pids_dir) for p in name.split("_")[1:]]
        server = psutil.Process(pids[1])
        assert "serve_spawned" in " ".join(server.cmdline()) and pids[1] != driver.pid
        driver.kill()
        driver.wait()
        # A worker (or the server) outliving its driver lives on for good: any bound catches it.
        alive = [p for p in pids if psutil.pid_exists(p)]
        wait_until(lambda: not any(psutil.pid_exists(p) for p in alive), 10.0, "to die")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_a_fresh_fork_server_that_cannot_start_falls_back_to_spawning_with_a_hint(
    storage, monkeypatch, cuda_initialised, caplog
):
    from phalanx._internal.engines.local import forkserver

    monkeypatch.delenv("PHALANX_START_METHOD")
    monkeypatch.setattr(forkserver, "_BOOT", "import sys; sys.exit(3)")
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        worker = fit(describe_worker, storage, workers=1).return_value
    assert SPAWN_SERVER in worker["parent"] and worker["fresh"]
    warning = [r.getMessage() for r in caplog.records if "fresh fork server" in r.message]
    assert len(warning) == 1 and "exit code 3" in warning[0] and "HINT:" in warning[0]


def test_a_fresh_fork_server_imports_torch_and_the_packages_main_imported(monkeypatch):
    import types

    from phalanx._internal.engines.local.forkserver import main_imports

    torch = pytest.importorskip("torch")
    main = types.ModuleType("__main__")
    main.psutil, main.os, main.Process = psutil, os, psutil.Process  # os: the standard library
    main.tensor = torch.zeros(1)  # an object: its class's package
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert main_imports() == ("psutil", "torch")


def test_forcing_fork_after_cuda_was_initialised_fails_at_fit_with_a_hint(
    storage, monkeypatch, cuda_initialised
):
    monkeypatch.setenv("PHALANX_START_METHOD", "fork")
    start = time.monotonic()
    with pytest.raises(ConfigError, match="CUDA is already initialised") as info:
        fit(lambda: None, storage)
    assert time.monotonic() - start < 5.0  # before any worker is started
    assert "HINT: unset PHALANX_START_METHOD" in str(info.value)


def test_an_unknown_start_method_fails_at_fit_with_a_hint(storage, monkeypatch):
    monkeypatch.setenv("PHALANX_START_METHOD", "forkserver")
    with pytest.raises(ConfigError, match="'forkserver' is not a start method") as info:
        fit(lambda: None, storage)
    assert "HINT:" in str(info.value)


@pytest.mark.parametrize(
    ("requested", "linux", "cuda", "chosen"),
    [
        (None, True, False, "fork"),
        (None, True, True, "spawn"),
        (None, False, False, "spawn"),
        ("spawn", True, False, "spawn"),
        ("fork", True, False, "fork"),
        ("Spawn", False, True, "spawn"),
        ("fork", False, False, ConfigError),
        ("fork", True, True, ConfigError),
    ],
)
def test_the_start_method_is_chosen_by_request_platform_and_cuda(
    monkeypatch, requested, linux, cuda, chosen
):
    if requested is None:
        monkeypatch.delenv("PHALANX_START_METHOD")
    else:
        monkeypatch.setenv("PHALANX_START_METHOD", requested)
    monkeypatch.setattr(start_method, "fork_supported", lambda: linux)
    monkeypatch.setattr(start_method, "fork_unsafe_runtime", lambda: "CUDA" if cuda else None)
    if chosen is ConfigError:
        with pytest.raises(ConfigError, match="HINT:"):
            start_method.choose_start_method()
    else:
        assert start_method.choose_start_method().name == chosen


def test_a_platform_without_posix_processes_fails_at_fit_with_a_hint(storage, monkeypatch):
    monkeypatch.setattr(start_method, "posix_supported", lambda: False)
    with pytest.raises(ConfigError, match="POSIX") as info:
        start_method.choose_start_method()
    assert "HINT: run phalanx under WSL" in str(info.value)


def test_the_runtime_check_never_imports_torch_or_jax():
    code = (
        "import sys; from phalanx._internal.engines.local import start_method as s; "
        "assert s.fork_unsafe_runtime() is None; assert not {'torch', 'jax'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_descendants_are_found_without_proc_as_on_macos(monkeypatch):
    """Off Linux the process tree comes from ``ps``: the same tree as from /proc."""
    from phalanx._internal.engines import process_tree

    child = subprocess.Popen(
        ["sh", "-c", "setsid sleep 60 & sleep 60; true"], start_new_session=True
    )  # a shell, and two grandchildren: one in a session of its own
    try:
        wait_until(lambda: len(process_tree.descendants(os.getpid())) >= 3, 10, "the tree")
        from_proc = process_tree.descendants(os.getpid())
        monkeypatch.setattr(process_tree, "_PROC", "/nonexistent")
        from_ps = set(process_tree.descendants(os.getpid()))
        assert set(from_proc) <= from_ps and len(from_ps - set(from_proc)) <= 1  # and ps itself
        killed = process_tree.kill_descendants(os.getpid())
        assert set(from_proc) <= killed
    finally:
        child.kill()
        child.wait()
