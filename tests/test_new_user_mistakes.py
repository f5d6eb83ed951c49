"""Mistakes a new user makes fail early, name what is wrong and suggest the fix (issue 28).

Real local worker processes, except the construction-time checks, which start none.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import tempfile
import traceback

import numpy as np
import pytest

import phalanx
from phalanx import (
    Checkpoint,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    WorkerGroupError,
)
from phalanx.errors import KeyNotFoundError, UnknownArgumentError
from phalanx.torch import TorchConfig, TorchTrainer
from phalanx.validation import ValidationConfig


def _noop(config):
    pass


# -- a config that cannot be pickled -----------------------------------------------------------


def test_an_unpicklable_config_value_fails_at_construction_naming_its_key(tmp_path):
    db = sqlite3.connect(":memory:")
    storage = tmp_path / "runs"
    try:
        with pytest.raises(ConfigError) as info:
            DataParallelTrainer(
                _noop,
                train_loop_config={"lr": 0.1, "data": np.zeros(10), "opt": {"db": db}},
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(storage_path=str(storage), name="run"),
            )
    finally:
        db.close()
    message = str(info.value)
    assert message.startswith(
        "train_loop_config['opt']['db']: cannot pickle 'sqlite3.Connection' object"
    )
    assert "\nHINT: build it inside the training function" in message
    assert not storage.exists()  # nothing was started, no run directory made


def test_a_large_picklable_config_is_accepted_and_reaches_the_workers(tmp_path):
    big = np.arange(12_500_000, dtype=np.float64)  # 100 MB: checked without being copied

    def train_func(config):
        phalanx.report({"sum": float(config["x"].sum()), "n": len(config["x"])})

    result = DataParallelTrainer(
        train_func,
        train_loop_config={"x": big},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=str(tmp_path), name="run"),
    ).fit()
    assert result.metrics["n"] == len(big) and result.metrics["sum"] == float(big.sum())


# -- misspelt keyword arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "wrong", "right"),
    [
        (RunConfig, "chekpoint_config", "checkpoint_config"),
        (ScalingConfig, "num_worker", "num_workers"),
        (CheckpointConfig, "num_to_kep", "num_to_keep"),
        (FailureConfig, "max_failure", "max_failures"),
        (DataConfig, "datasets_to_splt", "datasets_to_split"),
        (TorchConfig, "backnd", "backend"),
        (lambda **kw: ValidationConfig(_noop, **kw), "task_confg", "task_config"),
        (lambda **kw: DataParallelTrainer(_noop, **kw), "scaling_confg", "scaling_config"),
        (lambda **kw: TorchTrainer(_noop, **kw), "run_confg", "run_config"),
    ],
)
def test_a_misspelt_keyword_suggests_the_right_name(make, wrong, right):
    with pytest.raises(TypeError) as info:  # what code written for Python's error catches
        make(**{wrong: None})
    assert isinstance(info.value, UnknownArgumentError)
    assert f"unexpected keyword argument {wrong!r} (did you mean {right!r}?)" in str(info.value)


def test_keyword_checks_leave_correct_use_pickling_and_replace_alone():
    import dataclasses

    config = RunConfig(name="a", checkpoint_config=CheckpointConfig(num_to_keep=2))
    assert pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.replace(config, name="b").name == "b"
    with pytest.raises(UnknownArgumentError, match=r"'zzz'\.\nRunConfig takes: callbacks, "):
        RunConfig(zzz=1)


# -- a configuration error found after the start -------------------------------------------------


def _reports_loss(config):
    for step in range(3):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "weights"), "w") as f:
            f.write(str(step))
        checkpoint = Checkpoint.from_directory(directory)
        phalanx.report({"loss": 1.0 / (step + 1), "step": step}, checkpoint=checkpoint)


def _fit_scored_by(tmp_path, attribute):
    return DataParallelTrainer(
        _reports_loss,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path),
            name="run",
            checkpoint_config=CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute=attribute, checkpoint_score_order="min"
            ),
        ),
    ).fit()


def test_a_config_error_commits_nothing_and_the_fixed_rerun_starts_afresh(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="checkpoint_score_attribute='los'") as info:
        _fit_scored_by(tmp_path, "los")
    internal = os.path.join("phalanx", "_internal")
    assert not [f for f in traceback.extract_tb(info.value.__traceback__) if internal in f.filename]
    assert not [p for p in run_dir.iterdir() if p.name.startswith("checkpoint_0")]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["config_error"].startswith("CheckpointConfig(checkpoint_score_attribute='los')")

    result = _fit_scored_by(tmp_path, "loss")

    assert "Starting run 'run' afresh, not resuming it" in caplog.text
    # The failed fit()'s files are set aside in the run directory, never deleted.
    (aside,) = [p for p in run_dir.iterdir() if p.name.startswith("config_error_")]
    assert '"step": 0' in (aside / "metrics_all_ranks.jsonl").read_text()  # the ranks' reports
    assert "Resuming run" not in caplog.text
    assert result.attempts == 1 and result.attempt_errors == [None]
    assert result.metrics["step"] == 2
    assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3]
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000002")


def test_a_config_error_after_a_committed_checkpoint_keeps_it_and_resumes(tmp_path, caplog):
    def loop(config):
        first = 0 if phalanx.get_checkpoint() is None else 1
        for step in range(first, 3):
            directory = tempfile.mkdtemp()
            metrics = {"step": step} if step == config["unscored"] else {"loss": 1.0, "step": step}
            phalanx.report(metrics, checkpoint=Checkpoint.from_directory(directory))

    def fit(unscored):
        return DataParallelTrainer(
            loop,
            train_loop_config={"unscored": unscored},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(
                storage_path=str(tmp_path),
                name="run",
                checkpoint_config=CheckpointConfig(checkpoint_score_attribute="loss"),
            ),
        ).fit()

    with pytest.raises(ConfigError, match="has no metric 'loss'"):
        fit(unscored=1)
    result = fit(unscored=-1)
    assert "Resuming run 'run' from checkpoint_000000" in caplog.text
    assert "afresh" not in caplog.text
    assert (tmp_path / "run" / "checkpoint_000000").is_dir()
    assert result.metrics["step"] == 2


# -- a dataset name that is not there ------------------------------------------------------------


def test_a_missing_dataset_name_suggests_the_closest_on_its_own_line(tmp_path):
    def train_func():
        phalanx.get_dataset_shard("training")

    with pytest.raises(WorkerGroupError) as info:
        DataParallelTrainer(
            train_func,
            datasets={"train": [{"x": 1}, {"x": 2}], "valid": [{"x": 3}]},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(storage_path=str(tmp_path), name="run"),
        ).fit()
    failure = info.value.worker_failures[0]
    assert isinstance(failure.exception, KeyNotFoundError)
    assert isinstance(failure.exception, KeyError)  # Ray raises KeyError: except KeyError works
    assert str(failure.exception) == (
        "No dataset named 'training'; the trainer was given ['train', 'valid'].\n"
        "HINT: did you mean 'train'?"
    )
    assert "KeyNotFoundError: No dataset named 'training'" in failure.traceback
    assert "\\n" not in str(info.value)


# -- a failing rank's log ----------------------------------------------------------------------


def test_a_failing_ranks_log_has_the_attempt_header_and_its_traceback(tmp_path, capsys):
    from phalanx.cli import main

    def train_func():
        rank = phalanx.get_context().get_world_rank()
        print(f"rank {rank} starts", flush=True)
        if rank == 1:
            raise ValueError("rank one is broken")

    with pytest.raises(WorkerGroupError):
        DataParallelTrainer(
            train_func,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path), name="run"),
        ).fit()
    capsys.readouterr()

    assert main(["logs", str(tmp_path / "run"), "--rank", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("===== attempt 1 (")
    assert "rank 1 starts" in lines
    failed = next(i for i, line in enumerate(lines) if line.startswith("===== attempt 1: this"))
    assert lines[failed].startswith("===== attempt 1: this rank failed (")
    assert '    raise ValueError("rank one is broken")' in lines
    assert lines[-1] == "ValueError: rank one is broken"

    assert main(["logs", str(tmp_path / "run"), "--rank", "0"]) == 0
    rank0 = capsys.readouterr().out
    assert rank0.startswith("===== attempt 1 (") and "rank one is broken" not in rank0
