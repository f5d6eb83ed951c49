"""The controller's logic on the thread engine: rounds, commits, retention, errors, resume.

Workers are threads here, so these tests take milliseconds; the same behaviour on real
processes is covered in tests/engines/test_contract.py (which also runs on this engine: a
retry from the latest checkpoint is there) and tests/worker/ (the metric checks).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

import phalanx as train
from phalanx import (
    Callback,
    Checkpoint,
    CheckpointConfig,
    ConfigError,
    ControllerError,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)


def fit(fn, storage, name="run", workers=2, config=None, **run_kwargs):
    trainer = DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    )
    return trainer.fit()


def report_with_files(metrics, files):
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        train.report(metrics, checkpoint=Checkpoint.from_directory(d))


def counting_loop(config):
    rank = train.get_context().get_world_rank()
    for step in range(config["steps"]):
        train.report({"step": step, "rank": rank, "loss": config["losses"][step]})


def test_every_round_is_kept_in_order(storage):
    losses = [5.0, 4.0, 3.0, 2.0, 1.0]
    result = fit(counting_loop, storage, config={"steps": 5, "losses": losses})
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3, 4]
    assert list(df["rank"]) == [0] * 5
    assert list(df["training_iteration"]) == [1, 2, 3, 4, 5]
    assert result.metrics == {"step": 4, "rank": 0, "loss": 1.0}
    ranks = result.all_ranks_metrics_dataframe
    assert sorted(zip(ranks["rank"], ranks["step"])) == [(r, s) for r in (0, 1) for s in range(5)]


def test_checkpoint_parts_of_all_ranks_merge_into_one_directory(storage):
    def loop():
        rank = train.get_context().get_world_rank()
        report_with_files({"r": rank}, {f"part_{rank}.txt": str(rank), "shared.txt": "x"})

    result = fit(loop, storage)
    assert sorted(os.listdir(result.checkpoint.path)) == ["part_0.txt", "part_1.txt", "shared.txt"]
    assert os.path.basename(result.checkpoint.path) == "checkpoint_000000"
    assert not os.path.exists(os.path.join(result.path, ".staging"))


def test_a_checkpoint_from_some_ranks_only_is_committed(storage):
    def loop():
        rank = train.get_context().get_world_rank()
        if rank == 1:
            report_with_files({"r": rank}, {"model.txt": "from rank 1"})
        else:
            train.report({"r": rank})

    result = fit(loop, storage)
    assert os.listdir(result.checkpoint.path) == ["model.txt"]
    assert result.metrics == {"r": 0}


def test_retention_keeps_best_by_score_and_the_latest(storage):
    losses = [3.0, 1.0, 2.0, 0.5, 4.0]

    def loop(config):
        for step, loss in enumerate(config["losses"]):
            report_with_files({"loss": loss, "step": step}, {"step": str(step)})

    result = fit(
        loop,
        storage,
        workers=1,
        config={"losses": losses},
        checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        ),
    )
    kept = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_0"))
    # best two: step 3 (0.5) and step 1 (1.0); the latest (step 4) is kept as well
    assert kept == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    assert [m["step"] for _, m in result.best_checkpoints] == [4, 1, 3]  # worst first
    assert result.get_best_checkpoint("loss", "min").path.endswith("checkpoint_000003")
    assert result.checkpoint.path.endswith("checkpoint_000004")


def test_retention_without_score_keeps_the_newest(storage):
    def loop():
        for step in range(4):
            report_with_files({"step": step}, {"step": str(step)})

    result = fit(loop, storage, workers=1, checkpoint_config=CheckpointConfig(num_to_keep=2))
    kept = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_0"))
    assert kept == ["checkpoint_000002", "checkpoint_000003"]


def test_missing_score_attribute_is_a_config_error_before_the_checkpoint_is_committed(storage):
    def loop():
        report_with_files({"acc": 0.9}, {"w": "1"})

    with pytest.raises(ConfigError, match="checkpoint_score_attribute='loss'") as info:
        fit(
            loop,
            storage,
            workers=1,
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute="loss"),
        )
    assert "acc" in str(info.value)
    reloaded = Result.from_path(os.path.join(storage, "run"))
    assert reloaded.checkpoint is None
    assert not [d for d in os.listdir(reloaded.path) if d.startswith("checkpoint_0")]


def test_different_report_counts_commit_every_round(storage):
    """A rank that returned contributes nothing to later rounds: nothing is discarded."""

    def loop():
        rank = train.get_context().get_world_rank()
        for step in range(3 if rank == 0 else 2):
            train.report({"step": step, "rank": rank})

    result = fit(loop, storage)
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2]
    assert result.metrics == {"step": 2, "rank": 0}
    assert len(result.all_ranks_metrics_dataframe) == 5


def test_an_exception_carries_rank_type_message_and_user_traceback(storage):
    def loop():
        train.report({"step": 0})
        if train.get_context().get_world_rank() == 1:
            raise KeyError("no such column")

    with pytest.raises(TrainingFailedError) as info:
        fit(loop, storage)
    error = info.value
    assert list(error.worker_failures) == [1]
    failure = error.worker_failures[1]
    assert failure.type_name == "KeyError"
    assert "no such column" in str(error)
    assert "[rank 1] KeyError" in str(error)
    assert 'raise KeyError("no such column")' in failure.traceback
    assert failure.traceback.splitlines()[1].strip().startswith(f'File "{__file__}"')
    assert isinstance(error.__cause__, KeyError)
    assert error.result is not None and error.result.error is error


def test_callbacks_see_every_rank_and_a_raising_callback_fails_the_run(storage):
    seen = []

    class Recorder(Callback):
        def after_report(self, run_context, metrics, checkpoint):
            seen.append(([m["rank"] for m in metrics], checkpoint is not None))

    def loop():
        rank = train.get_context().get_world_rank()
        train.report({"rank": rank})
        report_with_files({"rank": rank}, {"f": "x"})

    fit(loop, storage, callbacks=[Recorder()])
    assert seen == [([0, 1], False), ([0, 1], True)]

    class Broken(Callback):
        def after_report(self, run_context, metrics, checkpoint):
            raise RuntimeError("callback bug")

    with pytest.raises(ControllerError, match=r"Broken\.after_report raised RuntimeError"):
        fit(loop, storage, name="broken", callbacks=[Broken()])


def resumable_loop(config):
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        report_with_files({"step": step}, {"step": str(step)})
        if config.get("fail_at") == step and train.get_context().get_attempt() == 0:
            raise RuntimeError("preempted")


def test_same_name_and_storage_resumes_and_continues_the_history(storage):
    fit(resumable_loop, storage, config={"steps": 3})
    result = fit(resumable_loop, storage, config={"steps": 5})
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3, 4]
    assert list(df["training_iteration"]) == [1, 2, 3, 4, 5]
    assert result.checkpoint.path.endswith("checkpoint_000004")


def test_without_retries_the_failure_is_raised_with_what_was_committed(storage):
    with pytest.raises(TrainingFailedError, match="preempted") as info:
        fit(resumable_loop, storage, workers=1, config={"steps": 5, "fail_at": 2})
    # every report made before the exception is committed
    assert info.value.result.checkpoint.path.endswith("checkpoint_000002")
    assert list(info.value.result.metrics_dataframe["step"]) == [0, 1, 2]


def test_resume_from_checkpoint_starts_a_new_run_from_it(storage):
    first = fit(resumable_loop, storage, name="first", config={"steps": 2})
    trainer = DataParallelTrainer(
        resumable_loop,
        train_loop_config={"steps": 4},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name="second", storage_path=storage),
        resume_from_checkpoint=first.checkpoint,
    )
    result = trainer.fit()
    assert list(result.metrics_dataframe["step"]) == [2, 3]


def test_checkpoint_dir_name_and_trainer_metadata(storage):
    def loop():
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "w"), "w") as f:
                f.write("1")
            train.report(
                {"a": 1}, checkpoint=Checkpoint.from_directory(d), checkpoint_dir_name="epoch_1"
            )

    trainer = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name="meta", storage_path=storage),
        metadata={"owner": "me"},
    )
    result = trainer.fit()
    assert result.checkpoint.path.endswith("/epoch_1")
    assert result.checkpoint.get_metadata() == {"owner": "me"}


def test_result_from_path_matches_the_result(storage):
    result = fit(
        resumable_loop,
        storage,
        config={"steps": 3},
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    )
    reloaded = Result.from_path(result.path)
    assert reloaded.metrics == result.metrics
    assert reloaded.checkpoint == result.checkpoint
    assert reloaded.best_checkpoints == result.best_checkpoints
    assert reloaded.metrics_dataframe.equals(result.metrics_dataframe)
    snapshot = json.loads(
        Path(os.path.join(result.path, "checkpoint_manager_snapshot.json")).read_text()
    )
    assert snapshot["latest"] == "checkpoint_000002"
