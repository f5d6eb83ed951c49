"""Behaviours where phalanx used to differ from Ray Train 2.60, each on the real local engine
with 2 workers and named after the Ray doc or test it comes from.

- Ray's fault-tolerance guide reports a checkpoint of an empty ``TemporaryDirectory`` (the save
  left as a comment): an empty directory is a checkpoint.
- ``ray.train.get_all_reported_checkpoints`` "blocks until Ray Train has finished processing
  every in-flight report call", also on a rank that reported without a checkpoint.
- ``Result.get_best_checkpoint`` with an unknown metric: Ray's tests match "Invalid metric name".
- Ray reserves no metric name such as ``attempt``: phalanx keeps its own column apart.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

import phalanx as train
from phalanx import (
    Checkpoint,
    CheckpointConsistencyMode,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
)

pytestmark = pytest.mark.slow

TWO = ScalingConfig(num_workers=2)
ATTEMPT_COLUMN = "_phalanx_attempt"


def wait_for(path: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


# -- user-guides/fault-tolerance: "Checkpoint.from_directory(temp_checkpoint_dir)", save elided --


def test_fault_tolerance_guide_reports_an_empty_temporary_directory(storage):
    """The guide's loop as written: the save is a comment, so the directory is empty. Ray commits
    it; the next attempt (and Result) gets it back."""

    def train_func():
        start = 0
        checkpoint = train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                start = len(os.listdir(d)) + 10  # empty: 10 proves a checkpoint came back
        for epoch in range(start, start + 2):
            with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
                # torch.save(model.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
                train.report(
                    {"epoch": epoch},
                    checkpoint=Checkpoint.from_directory(temp_checkpoint_dir),
                )
            if epoch == 1 and train.get_context().get_attempt() == 0:
                raise RuntimeError("fail once, after two empty checkpoints")

    result = DataParallelTrainer(
        train_func,
        scaling_config=TWO,
        run_config=RunConfig(storage_path=storage, failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert result.attempts == 2
    assert result.metrics["epoch"] == 11  # the retry resumed from the empty checkpoint
    assert len(result.best_checkpoints) == 4
    assert os.path.isdir(result.checkpoint.path)
    assert [n for n in os.listdir(result.checkpoint.path) if not n.startswith(".")] == []


def test_a_missing_checkpoint_directory_is_still_an_error(storage, tmp_path):
    missing = str(tmp_path / "never_created")

    def train_func():
        try:
            train.report({}, checkpoint=Checkpoint.from_directory(missing))
        except FileNotFoundError as exc:
            return str(exc)
        return None

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    assert "not a directory" in result.return_value and "HINT:" in result.return_value
    assert result.checkpoint is None


# -- train_fn_utils.get_all_reported_checkpoints: "Blocks until Ray Train has finished processing
# every in-flight report call" ---------------------------------------------------------------


@pytest.mark.parametrize("mode", list(CheckpointConsistencyMode))
def test_get_all_reported_checkpoints_blocks_until_every_in_flight_report(storage, tmp_path, mode):
    """Rank 1 reports without a checkpoint while rank 0, later, passes one in the same round:
    rank 1's call returns only once that round is processed, so it sees rank 0's checkpoint.
    A round where no rank passes a checkpoint does not make the call wait forever."""
    rank1_asked = str(tmp_path / "rank1_asked")

    def train_func():
        rank = train.get_context().get_world_rank()
        seen = []
        for step in range(3):
            checkpoint = None
            if rank == 0 and step < 2:
                if step == 0:
                    wait_for(rank1_asked)  # rank 1 is (about to be) waiting already
                d = tempfile.mkdtemp(dir=str(tmp_path))
                Path(d, "step").write_text(str(step))
                checkpoint = Checkpoint.from_directory(d)
            train.report({"step": step}, checkpoint=checkpoint)
            if rank == 1 and step == 0:
                Path(rank1_asked).write_text("1")
            reported = train.get_all_reported_checkpoints(consistency_mode=mode, timeout_s=60)
            seen.append([r.metrics["step"] for r in reported])
        Path(tmp_path, f"seen_{rank}.json").write_text(json.dumps(seen))

    DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    for rank in (0, 1):
        seen = json.loads(Path(tmp_path, f"seen_{rank}.json").read_text())
        assert seen == [[0], [0, 1], [0, 1]], f"rank {rank}"


def test_get_all_reported_checkpoints_times_out_with_the_list_as_it_stands(storage, tmp_path):
    """Ray's checkpoint manager: on timeout it returns the checkpoints processed so far (no
    error, the loop keeps training); phalanx also logs a WARNING naming what it did not wait for."""
    rank1_timed_out = str(tmp_path / "rank1_timed_out")

    def train_func():
        import logging

        rank = train.get_context().get_world_rank()
        if rank == 0:
            wait_for(rank1_timed_out)  # round 0 is incomplete until rank 1 gave up waiting
            train.report(
                {"step": 0}, checkpoint=Checkpoint.from_directory(tempfile.mkdtemp(dir=tmp_path))
            )
            return None
        warnings: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                warnings.append(record.getMessage())

        logging.getLogger("phalanx").addHandler(Keep(logging.WARNING))
        train.report({"step": 0})
        reported = train.get_all_reported_checkpoints(timeout_s=0.5)
        Path(rank1_timed_out).write_text(json.dumps([len(reported), warnings]))
        return None

    DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    count, warnings = json.loads(Path(rank1_timed_out).read_text())
    assert count == 0
    assert any("timed out" in w and "up to round 0" in w for w in warnings), warnings


def test_get_all_reported_checkpoints_after_a_round_without_checkpoint_num_workers_0(storage):
    """With num_workers=0 the driver runs only when a message arrives: the wait still ends."""

    def train_func():
        with tempfile.TemporaryDirectory() as d:
            train.report({"step": 0}, checkpoint=Checkpoint.from_directory(d))
        train.report({"step": 1})
        return [r.metrics["step"] for r in train.get_all_reported_checkpoints(timeout_s=30)]

    result = DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    assert result.return_value == [0]


# -- air/result.py get_best_checkpoint: RuntimeError "Invalid metric name ..." ---------------------


def test_result_get_best_checkpoint_invalid_metric_name(storage):
    def train_func():
        with tempfile.TemporaryDirectory() as d:
            Path(d, "w").write_text("1")
            train.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))

    result = DataParallelTrainer(
        train_func, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
    ).fit()
    with pytest.raises(RuntimeError, match=r"^Invalid metric name nope!") as info:
        result.get_best_checkpoint(metric="nope", mode="max")
    assert "HINT:" in str(info.value) and "loss" in str(info.value)
    assert result.get_best_checkpoint(metric="loss", mode="min") is not None


# -- Ray reserves no metric name: a script reporting {"attempt": k} runs unchanged ----------------


def retry_loop(config):
    """Reports ``step`` (and, with ``user_attempt``, the user's own ``attempt``, a common name);
    fails once after round 1's checkpoint, and the retry continues from it."""
    ctx = train.get_context()
    start = 0
    if train.get_checkpoint():
        with train.get_checkpoint().as_directory() as d:
            start = int(Path(d, "step").read_text()) + 1
    for step in range(start, 4):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "step").write_text(str(step))
            checkpoint = Checkpoint.from_directory(d) if step == 1 else None
            metrics = (
                {"step": step, "attempt": 100 + step} if config["user_attempt"] else {"step": step}
            )
            train.report(metrics, checkpoint=checkpoint)
        if step == 2 and ctx.get_attempt() == 0:
            raise RuntimeError("fail once")


def fit_retry_loop(storage: str, user_attempt: bool) -> Result:
    return DataParallelTrainer(
        retry_loop,
        train_loop_config={"user_attempt": user_attempt},
        scaling_config=TWO,
        run_config=RunConfig(
            name="retry", storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()


def test_a_metric_named_attempt_is_the_users(storage):
    result = fit_retry_loop(storage, user_attempt=True)
    assert result.metrics == {"step": 3, "attempt": 103}
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3]  # the retry's step 2 supersedes attempt 1's
    assert list(df["attempt"]) == [100, 101, 102, 103]
    assert list(df[ATTEMPT_COLUMN]) == [1, 1, 2, 2]
    everything = result.all_ranks_metrics_dataframe
    assert sorted(set(everything["attempt"])) == [100, 101, 102, 103]
    assert sorted(set(everything[ATTEMPT_COLUMN])) == [1, 2]
    reloaded = Result.from_path(result.path)
    assert reloaded.metrics == result.metrics
    assert reloaded.metrics_dataframe.equals(df)
    assert reloaded.best_checkpoints[0][1] == {"step": 1, "attempt": 101}


def test_a_run_written_with_the_old_attempt_column_reads_as_before(storage):
    """Runs written before the column was renamed have ``attempt`` with phalanx's meaning: it is
    read as phalanx's column, never as a metric, also once resumed rows follow in the new one."""
    result = fit_retry_loop(storage, user_attempt=False)
    for name in ("metrics.jsonl", "metrics_all_ranks.jsonl"):
        path = os.path.join(result.path, name)
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        assert all("attempt" not in r for r in rows)
        old = [{**_without(r, ATTEMPT_COLUMN), "attempt": r[ATTEMPT_COLUMN]} for r in rows]
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in old))

    reloaded = Result.from_path(result.path)
    assert reloaded.metrics == {"step": 3}
    df = reloaded.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3]  # attempt 1's step 2 superseded, as before
    assert list(df[ATTEMPT_COLUMN]) == [1, 1, 2, 2]
    assert "attempt" not in df.columns
    everything = reloaded.all_ranks_metrics_dataframe
    assert sorted(set(everything[ATTEMPT_COLUMN])) == [1, 2] and "attempt" not in everything

    # Run again: attempts 3 (fails once more at step 2) and 4 continue from step 1's checkpoint
    df = fit_retry_loop(storage, user_attempt=False).metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3]
    assert list(df[ATTEMPT_COLUMN]) == [1, 1, 4, 4] and "attempt" not in df.columns


def _without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}
