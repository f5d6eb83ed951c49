"""Validation outcomes a user sees in get_all_reported_checkpoints(): validated, failed, timed
out; training goes on in every case. Runs with num_workers=0 (the driver's thread)."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import phalanx as train
from phalanx import Checkpoint, RunConfig, ScalingConfig, ValidationConfig, ValidationTaskConfig


def test_failed_and_timed_out_validations_do_not_fail_training(storage):
    release = threading.Event()

    def validate(checkpoint, behaviour="ok"):
        if behaviour == "raise":
            raise ValueError("validation data missing")
        if behaviour == "slow":
            release.wait(10)
        return {"val": 1.0}

    def train_func():
        for behaviour in ("ok", "raise", "slow"):
            with tempfile.TemporaryDirectory() as d:
                Path(os.path.join(d, "b")).write_text(behaviour)
                task = ValidationTaskConfig(
                    fn_kwargs={"behaviour": behaviour},
                    timeout_s=0.3 if behaviour == "slow" else None,
                )
                train.report(
                    {"b": behaviour}, checkpoint=Checkpoint.from_directory(d), validation=task
                )
        statuses = {
            r.metrics["b"]: (r.status, r.metrics.get("val"))
            for r in train.get_all_reported_checkpoints(timeout_s=30)
        }
        release.set()
        return statuses

    result = train.DataParallelTrainer(
        train_func,
        validation_config=ValidationConfig(validate),
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    status = train.ReportedCheckpointStatus
    assert result.return_value == {
        "ok": (status.VALIDATED, 1.0),
        "raise": (status.VALIDATION_FAILED, None),
        "slow": (status.VALIDATION_TIMEOUT, None),
    }
    assert len(result.best_checkpoints) == 3


def test_committed_mode_does_not_wait_for_validation(storage):
    gate = threading.Event()

    def validate(checkpoint):
        gate.wait(10)
        return {}

    def train_func():
        with tempfile.TemporaryDirectory() as d:
            Path(os.path.join(d, "w")).write_text("1")
            train.report({}, checkpoint=Checkpoint.from_directory(d), validation=True)
        try:
            committed = train.get_all_reported_checkpoints(
                consistency_mode=train.CheckpointConsistencyMode.COMMITTED, timeout_s=5
            )
            # VALIDATED waits for the validation; on timeout the list as it stands, as Ray.
            timed_out = train.get_all_reported_checkpoints(timeout_s=0.2)
        finally:
            gate.set()
        return [r.status for r in committed], [r.status for r in timed_out]

    result = train.DataParallelTrainer(
        train_func,
        validation_config=ValidationConfig(validate),
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    statuses, timed_out = result.return_value
    assert statuses == [train.ReportedCheckpointStatus.PENDING_VALIDATION]
    assert timed_out == [train.ReportedCheckpointStatus.PENDING_VALIDATION]


def test_a_validation_cut_off_by_the_driver_runs_again_on_resume(storage):
    gate = threading.Event()
    calls = []

    def validate(checkpoint):
        calls.append(checkpoint.path)
        gate.wait(10)
        return {"val": 0.5}

    def interrupted():
        with tempfile.TemporaryDirectory() as d:
            Path(os.path.join(d, "w")).write_text("1")
            train.report({"step": 0}, checkpoint=Checkpoint.from_directory(d), validation=True)
        raise KeyboardInterrupt  # Ctrl-C while the validation runs

    def resumed():
        train.report({"step": 1})

    def trainer(fn):
        return train.DataParallelTrainer(
            fn,
            validation_config=ValidationConfig(validate),
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(storage_path=storage, name="cut_off"),
        )

    try:
        trainer(interrupted).fit()
    except KeyboardInterrupt:
        pass
    gate.set()
    result = trainer(resumed).fit()
    assert len(calls) == 2 and calls[0] == calls[1]
    assert result.best_checkpoints[0][1] == {"step": 0, "val": 0.5}
