"""Straggler detection and the default hang rule, on every engine's real workers.

A rank that sleeps an extra 50 % per step is named (WARNING, Result, run.json, ``phalanx show``);
a uniform slowdown and a slow first round name nobody; with no ``hang_timeout_s`` set, a rank
that sleeps forever is detected under the default rule (its floor set small through
``PHALANX_HANG_TIMEOUT_FLOOR_S``) and named as the rank the others wait for.
"""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

import phalanx as train
from phalanx import DataParallelTrainer, FailureConfig, HangError, RunConfig, ScalingConfig
from phalanx.cli import main as cli_main

pytestmark = pytest.mark.slow

STEP_S = 0.1


def fit(loop, storage, engine, workers=3, config=None, **failure):
    return DataParallelTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine=engine.engine),
        run_config=RunConfig(
            name="run", storage_path=storage, failure_config=FailureConfig(**failure)
        ),
    ).fit()


def one_slow_rank(config):
    rank = train.get_context().get_world_rank()
    for step in range(20):
        time.sleep(STEP_S * (1.5 if rank == config["slow"] else 1.0))
        train.report({"step": step})


def test_a_rank_50_percent_slower_is_named_within_20_steps(storage, engine, caplog, capsys):
    caplog.set_level(logging.WARNING)
    result = fit(one_slow_rank, storage, engine, config={"slow": 1})

    [period] = result.stragglers
    assert period["rank"] == 1 and period["first_round"] >= 1 and period["last_round"] < 20
    assert 1.3 <= period["slowdown"] <= 1.8
    assert period["host"] and period["node_id"] and period["attempt"] == 1
    [warning] = [r.getMessage() for r in caplog.records if "Straggler" in r.getMessage()]
    assert warning.startswith(f"Straggler: rank 1 on host {period['host']} (node ")

    with open(os.path.join(result.path, "run.json")) as f:
        assert json.load(f)["stragglers"] == [period]
    assert train.Result.from_path(result.path).stragglers == [period]
    capsys.readouterr()
    assert cli_main(["show", result.path]) == 0
    shown = capsys.readouterr().out
    assert "stragglers:   1" in shown
    assert f"rank 1  {period['slowdown']}x  rounds {period['first_round']}-" in shown


def uniform_slowdown_after_a_slow_first_round(config):
    rank = train.get_context().get_world_rank()
    for step in range(16):
        if step == 0:
            time.sleep(1.0 if rank == 0 else 0.05)  # rank 0 loads its data slowly
        else:  # every rank slows down together half way through
            time.sleep(0.05 if step < 8 else 0.12)
        train.report({"step": step})


def test_a_uniform_slowdown_and_a_slow_first_round_name_nobody(storage, engine, caplog):
    if engine.id == "local-spawn":
        pytest.skip("reports reach the driver as on the fork path: local covers it")
    caplog.set_level(logging.WARNING)
    result = fit(uniform_slowdown_after_a_slow_first_round, storage, engine)
    assert result.stragglers == []
    assert not [r for r in caplog.records if "Straggler" in r.getMessage()]


def one_rank_sleeps_forever(config):
    import threading

    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    t = torch.ones(1)
    for step in range(10_000):
        if rank == 2 and step == 3:
            threading.Event().wait()  # rank 2 stops for good; the others wait in all_reduce
        dist.all_reduce(t)
        train.report({"step": step})


def test_with_no_hang_timeout_set_a_rank_that_sleeps_forever_is_named(storage, engine, monkeypatch):
    if not engine.processes:
        pytest.skip("threads share one process: no process group per rank, no stacks per rank")
    if engine.id == "local-spawn":
        pytest.skip("the watchdog runs in the driver as on the fork path: local covers it")
    pytest.importorskip("torch")
    from phalanx.torch import TorchTrainer

    # 2 s: the TorchTrainer imports torch and joins the group before the watchdog's clock
    # starts; before the first report 4x the floor, 8 s, covers importing this module on Ray
    monkeypatch.setenv("PHALANX_HANG_TIMEOUT_FLOOR_S", "2")
    assert FailureConfig().hang_timeout_s == "auto"
    start = time.monotonic()
    with pytest.raises(HangError) as info:
        TorchTrainer(
            one_rank_sleeps_forever,
            scaling_config=ScalingConfig(num_workers=3, engine=engine.engine),
            run_config=RunConfig(name="run", storage_path=storage),
        ).fit()
    # start-up (Ray's workers import torch), the floor (rounds take ~10 ms: 10x the slowest is
    # below it), stacks and teardown
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert "the default rule, hang_timeout_s='auto'" in message
    assert "PHALANX_HANG_TIMEOUT_FLOOR_S" in message
    assert "-> rank 2 " in message, message
