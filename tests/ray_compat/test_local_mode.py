"""``ScalingConfig(num_workers=0)``: Ray 2.60's local mode. The training function runs in the
thread that called ``fit()`` (so breakpoints and IDE debuggers work), with world size 1 and no
process group; reports, checkpoints and the Result are as with workers."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest

import phalanx as train
from phalanx import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx.collective import barrier, broadcast_from_rank_zero

LOCAL = ScalingConfig(num_workers=0)


def test_the_function_runs_in_the_calling_thread_and_its_reports_are_stored(storage):
    caller = threading.get_ident()
    closure_state = {"calls": 0}  # not a copy: the function object itself runs

    def train_func(config):
        closure_state["calls"] += 1
        context = train.get_context()
        assert threading.get_ident() == caller
        assert (context.get_world_rank(), context.get_world_size()) == (0, 1)
        assert (context.get_local_rank(), context.get_node_rank()) == (0, 0)
        for step in range(config["steps"]):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "step")).write_text(str(step))
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            # committed as it is reported: visible right away
            assert len(train.get_all_reported_checkpoints()) == min(step + 1, 2)
        assert broadcast_from_rank_zero({"x": 1}) == {"x": 1}
        barrier()
        return "done"

    result = train.DataParallelTrainer(
        train_func,
        train_loop_config={"steps": 4},
        scaling_config=LOCAL,
        run_config=RunConfig(
            storage_path=storage, checkpoint_config=CheckpointConfig(num_to_keep=2)
        ),
    ).fit()
    assert closure_state["calls"] == 1
    assert result.return_value == "done"
    assert result.metrics == {"step": 3}
    assert len(result.metrics_dataframe) == 4
    assert [m["step"] for _, m in result.best_checkpoints] == [2, 3]
    with pytest.raises(train.SessionMisuseError):  # the driver is the driver again
        train.report({"after": 1})


def test_the_function_need_not_pickle(storage):
    lock = threading.Lock()  # cannot be pickled: fine, nothing is sent anywhere

    def train_func():
        with lock:
            train.report({"ok": 1})

    assert train.DataParallelTrainer(
        train_func, scaling_config=LOCAL, run_config=RunConfig(storage_path=storage)
    ).fit().metrics == {"ok": 1}


def test_a_breakpoint_stops_in_the_training_function(storage):
    """What a debugger sees: the trace hook of the calling thread fires inside train_func."""
    seen = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "train_func":
            seen.append(threading.get_ident())
        return None

    def train_func():
        train.report({"a": 1})

    sys.settrace(tracer)
    try:
        train.DataParallelTrainer(
            train_func, scaling_config=LOCAL, run_config=RunConfig(storage_path=storage)
        ).fit()
    finally:
        sys.settrace(None)
    assert seen == [threading.get_ident()]


def test_failures_and_retries_as_with_workers(storage):
    attempts = []

    def train_func():
        checkpoint = train.get_checkpoint()
        attempts.append(train.get_context().get_attempt())
        start = 0
        if checkpoint:
            with checkpoint.as_directory() as d:
                start = int(Path(os.path.join(d, "step")).read_text()) + 1
        for step in range(start, 3):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "step")).write_text(str(step))
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            if step == 1 and len(attempts) == 1:
                raise ValueError("flaky")

    result = train.DataParallelTrainer(
        train_func,
        scaling_config=LOCAL,
        run_config=RunConfig(storage_path=storage, failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert attempts == [0, 1]
    assert result.metrics == {"step": 2}

    def always_fails():
        raise ValueError("broken model")

    with pytest.raises(train.WorkerGroupError, match="broken model"):
        train.DataParallelTrainer(
            always_fails, scaling_config=LOCAL, run_config=RunConfig(storage_path=storage)
        ).fit()


@pytest.mark.slow
def test_torch_trainer_has_no_process_group(storage):
    torch = pytest.importorskip("torch")
    from phalanx.torch import TorchTrainer, get_device, prepare_model

    def train_func():
        assert not torch.distributed.is_initialized()
        model = prepare_model(torch.nn.Linear(2, 1))
        assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        train.report({"loss": loss.item(), "device": str(get_device())})

    env_before = dict(os.environ)
    result = TorchTrainer(
        train_func, scaling_config=LOCAL, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert result.metrics["device"] == "cpu"
    assert dict(os.environ) == env_before  # no RANK/WORLD_SIZE/MASTER_ADDR left in the driver


@pytest.mark.slow
def test_xgboost_trainer_in_local_mode(storage):
    pytest.importorskip("xgboost")
    import pandas as pd

    from phalanx.data import from_pandas
    from phalanx.xgboost import XGBoostTrainer

    frame = pd.DataFrame({"x": [float(i) for i in range(40)], "y": [i % 2 for i in range(40)]})
    result = XGBoostTrainer(
        datasets={"train": from_pandas(frame)},
        label_column="y",
        params={"objective": "binary:logistic", "eval_metric": "logloss"},
        num_boost_round=3,
        scaling_config=LOCAL,
        run_config=RunConfig(storage_path=storage),
    ).fit()
    assert "train-logloss" in result.metrics
    assert XGBoostTrainer.get_model(result.checkpoint).num_boosted_rounds() == 3


@pytest.mark.slow
def test_lightgbm_trainer_in_local_mode_with_its_own_loop(storage):
    pytest.importorskip("lightgbm")
    import lightgbm
    import numpy as np

    from phalanx.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

    def train_func():
        x = np.arange(60, dtype=float).reshape(-1, 1)
        data = lightgbm.Dataset(x, label=(x[:, 0] > 30).astype(float))
        params = {"objective": "binary", "verbose": -1, **get_network_params()}
        assert get_network_params() == {}  # one process: no network
        lightgbm.train(
            params,
            data,
            num_boost_round=3,
            valid_sets=[data],
            valid_names=["train"],
            callbacks=[RayTrainReportCallback()],
        )

    result = LightGBMTrainer(
        train_func, scaling_config=LOCAL, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert "train-binary_logloss" in result.metrics
    assert result.checkpoint is not None
