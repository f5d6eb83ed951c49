"""fit() never waits forever and leaves nothing behind, on every engine whose workers are processes.

The same tests run on each engine: values the driver cannot unpickle fail the attempt naming the
rank and the type; workers that cannot be started are a WorkerStartupError that goes through the
failure policy; processes the training function started are gone when fit() returns.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time

import psutil
import pytest

import phalanx as train
from phalanx import (
    Callback,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    WorkerStartupError,
)

pytestmark = pytest.mark.slow


def fit(fn, storage, engine, workers=2, config=None, max_failures=0, callbacks=()):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine=engine.engine),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=list(callbacks),
        ),
    ).fit()


class TwoArgError(Exception):
    """Pickles fine; unpickling calls TwoArgError(a) and fails: __init__ takes two arguments."""

    def __init__(self, a, b):
        super().__init__(a)
        self.b = b


WORKER_ONLY_MODULE = textwrap.dedent(
    """
    class WorkerOnlyError(Exception):
        pass
    """
)


def send_what_the_driver_cannot_load(config):
    """Rank ``config["rank"]`` sends a value the driver cannot unpickle, as ``config["what"]``."""
    what, rank = config["what"], train.get_context().get_world_rank()
    if rank != config["rank"]:
        if what == "metric":
            train.report({"x": 1})
        return None
    if what == "metric":
        train.report({"x": TwoArgError("a", "b")})
    elif what == "return":
        return TwoArgError("a", "b")
    else:  # an exception class from a module only the workers can import
        import sys

        sys.path.insert(0, config["module_dir"])
        from worker_only import WorkerOnlyError

        raise WorkerOnlyError("only the worker knows this class")
    return None


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("what", "rank", "type_name"),
    [
        ("metric", 1, "TwoArgError"),
        ("return", 0, "TwoArgError"),
        ("exception", 1, "worker_only"),
    ],
)
def test_a_value_the_driver_cannot_unpickle_fails_the_attempt_naming_rank_and_type(
    storage, process_engine, tmp_path, what, rank, type_name
):
    (tmp_path / "worker_only.py").write_text(WORKER_ONLY_MODULE)
    config = {"what": what, "rank": rank, "module_dir": str(tmp_path)}
    start = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        fit(
            send_what_the_driver_cannot_load, storage, process_engine, config=config, max_failures=1
        )
    assert time.monotonic() - start < 120
    message = str(info.value)
    assert f"[rank {rank}]" in message and type_name in message, message
    assert rank in info.value.worker_failures
    assert info.value.result.attempts == 2  # retried once under max_failures=1, then raised


class Recorder(Callback):
    def __init__(self):
        self.errors = []

    def after_exception(self, run_context, exceptions):
        self.errors.append(exceptions)


@pytest.mark.timeout(240)
def test_workers_that_never_start_are_a_startup_error_through_the_failure_policy(
    storage, process_engine, monkeypatch
):
    monkeypatch.setenv("PHALANX_WORKER_START_TIMEOUT_S", "0.001")
    recorder = Recorder()
    with pytest.raises(WorkerStartupError) as info:
        fit(lambda: None, storage, process_engine, max_failures=1, callbacks=[recorder])
    assert "could not be started" in str(info.value) and "HINT:" in str(info.value)
    assert info.value.worker_failures and all(
        f.kind == "startup" for f in info.value.worker_failures.values()
    )
    result = info.value.result
    assert result is not None and result.attempts == 2
    assert all("could not be started" in (e or "") for e in result.attempt_errors)
    assert len(recorder.errors) == 2
    with open(os.path.join(storage, "run", "error.txt")) as f:
        assert "could not be started" in f.read()


def start_processes(config):
    """Start processes that leave the worker's reach in every way we know; write their pids."""
    import multiprocessing

    kinds = config["kinds"]
    pids = []
    if "popen" in kinds:  # in the worker's process group
        pids.append(subprocess.Popen(["sleep", "1000"]).pid)
    if "session" in kinds:  # a new session: not in the worker's process group
        pids.append(subprocess.Popen(["sleep", "1000"], start_new_session=True).pid)
    if "orphan" in kinds:  # a new session, and its parent exits: an orphan
        shell = subprocess.run(
            ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        pids.append(int(shell.stdout.strip()))
    if "mp" in kinds:
        proc = multiprocessing.Process(target=time.sleep, args=(1000,))
        proc.start()
        pids.append(proc.pid)
    rank = train.get_context().get_world_rank()
    tmp = os.path.join(os.path.dirname(config["dir"]), f"pids_{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(tmp, os.path.join(config["dir"], f"pids_{rank}"))
    train.report({"started": len(pids)})
    if config["fail"]:
        while len(os.listdir(config["dir"])) < train.get_context().get_world_size():
            time.sleep(0.01)  # every rank started its processes: now fail the attempt
        raise RuntimeError("fail after starting processes")


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def started_pids(directory):
    return [
        int(p) for name in os.listdir(directory) for p in (directory / name).read_text().split()
    ]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail", [False, True], ids=["succeeded", "failed"])
def test_processes_the_training_function_started_are_gone_after_fit(
    storage, process_engine, tmp_path, fail
):
    kinds = ["popen", "session", "orphan", "mp"]
    (tmp_path / "pids").mkdir()
    config = {"kinds": kinds, "dir": str(tmp_path / "pids"), "fail": fail}
    if fail:
        with pytest.raises(TrainingFailedError):
            fit(start_processes, storage, process_engine, config=config)
    else:
        fit(start_processes, storage, process_engine, config=config)
    returned = time.monotonic()
    pids = started_pids(tmp_path / "pids")
    assert len(pids) == 2 * len(kinds)
    # Killed at fit()'s end; the 10 s only let a loaded machine reap them (they sleep 1000 s)
    while any(alive(p) for p in pids) and time.monotonic() - returned < 10.0:
        time.sleep(0.01)
    assert not [p for p in pids if alive(p)], "processes outlived fit()"
