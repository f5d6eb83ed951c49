"""Report rounds, the metrics history and resume, on the thread engine (milliseconds each).

Rank-0-only reporting, rounds that a failing rank reached, the attempt column and the final
trajectory, a history file cut by a crash, and what re-running a script on the same name does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time

import pytest

import phalanx as train
from phalanx import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)


def fit(fn, storage, name="run", workers=2, config=None, **run_kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


def report(metrics, checkpoint=None):
    """report() that moves the checkpoint's temporary directory into the run (no leftovers)."""
    train.report(metrics, checkpoint=checkpoint, delete_local_checkpoint_after_upload=True)


def save(step, rank=0):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, f"step_{rank}"), "w") as f:
        f.write(str(step))
    return Checkpoint.from_directory(d)


def start_step():
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as d, open(os.path.join(d, "step_0")) as f:
        return int(f.read()) + 1


def wait_for(path, timeout_s=10.0):
    """In a training function: a timeout fails that rank, naming what never came."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def wait_for_reports(run_path, rank, count, timeout_s=30.0):
    """Until the driver has written ``count`` reports of ``rank`` to metrics_all_ranks.jsonl: it
    has then also looked for silent ranks with them in hand (the same poll, before the flush)."""
    rows = os.path.join(run_path, "metrics_all_ranks.jsonl")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(rows):
            with open(rows) as f:
                if sum(f'"rank": {rank},' in line for line in f) >= count:
                    return
        time.sleep(0.01)
    raise TimeoutError(f"the driver never wrote {count} reports of rank {rank}")


# -- report counts ------------------------------------------------------------------------------


def rank0_only_loop(config):
    """The habit from older Ray versions: only rank 0 reports, with a checkpoint every step."""
    rank = train.get_context().get_world_rank()
    if rank != 0:  # keeps training (in a real job: collectives) while rank 0 reports
        wait_for(config["rank0_done"])
        wait_for_reports(config["run_path"], 0, config["steps"])
        return
    for step in range(config["steps"]):
        report({"step": step}, checkpoint=save(step))
    open(config["rank0_done"], "w").close()


def test_rank0_only_reporting_commits_every_checkpoint_and_warns_once(storage, tmp_path, caplog):
    config = {"steps": 6, "rank0_done": str(tmp_path / "done"), "run_path": f"{storage}/run"}
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        result = fit(rank0_only_loop, storage, config=config)
    assert list(result.metrics_dataframe["step"]) == list(range(6))
    assert sorted(os.listdir(result.path)).count("checkpoint_000005") == 1
    assert [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints] == [
        f"checkpoint_{i:06d}" for i in range(6)
    ]
    assert result.metrics == {"step": 5}
    warnings = [r.getMessage() for r in caplog.records if "have not reported" in r.getMessage()]
    assert len(warnings) == 1
    assert "rank(s) 1" in warnings[0] and "HINT: call phalanx.report() on every rank" in warnings[0]


def rank0_slow_first_checkpoint_loop(config):
    """Every rank reports; rank 0 checkpoints and its first checkpoint is slow (a big one being
    written), so rank 1, reporting metrics only, runs ahead: rank 0 is behind, not silent."""
    rank = train.get_context().get_world_rank()
    if rank == 1:
        for step in range(config["steps"]):
            train.report({"step": step})
        return
    # the slow write: it ends only once the driver has seen rank 1 far ahead (its rows flushed)
    wait_for_reports(config["run_path"], 1, config["steps"])
    for step in range(config["steps"]):
        report({"step": step}, checkpoint=save(step))


def local_fit(fn, storage, config):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, engine="local"),
        run_config=RunConfig(name="run", storage_path=storage),
    ).fit()


@pytest.mark.slow
def test_a_rank_0_slow_on_its_first_checkpoint_is_not_called_silent(storage, caplog):
    # Before: "Rank 1 has reported 6 rounds but rank(s) 0 have not reported yet ... HINT: call
    # phalanx.report() on every rank", to a user who does.
    config = {"steps": 6, "run_path": os.path.join(storage, "run")}
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        result = local_fit(rank0_slow_first_checkpoint_loop, storage, config)
    with open(os.path.join(result.path, "metrics_all_ranks.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert sum(row["rank"] == 1 for row in rows[:6]) == 6  # rank 1 was far ahead indeed
    assert [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints] == [
        f"checkpoint_{i:06d}" for i in range(6)
    ]
    assert not [r for r in caplog.records if "have not reported" in r.getMessage()]


def rank1_silent_loop(config):
    rank = train.get_context().get_world_rank()
    if rank == 1:
        wait_for(config["rank0_done"], timeout_s=30.0)
        wait_for_reports(config["run_path"], 0, config["steps"])
        return
    for step in range(config["steps"]):
        report({"step": step}, checkpoint=save(step))
    open(config["rank0_done"], "w").close()


@pytest.mark.slow
def test_a_truly_silent_rank_is_named_with_local_workers(storage, tmp_path, caplog):
    config = {"steps": 6, "rank0_done": str(tmp_path / "done"), "run_path": f"{storage}/run"}
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        result = local_fit(rank1_silent_loop, storage, config)
    assert len(result.best_checkpoints) == 6
    warnings = [r.getMessage() for r in caplog.records if "have not reported" in r.getMessage()]
    assert len(warnings) == 1 and "rank(s) 1 have not reported" in warnings[0]


def test_rounds_after_rank0_returned_carry_the_next_ranks_metrics(storage):
    def loop():
        rank = train.get_context().get_world_rank()
        for step in range(1 if rank == 0 else 3):
            report({"step": step, "rank": rank})

    result = fit(loop, storage)
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2]
    assert list(df["rank"]) == [0, 1, 1]


# -- a failing rank: every complete round is committed, every report recorded -------------------


# The same on real processes, 20 times over: tests/controller/test_failure_rounds.py.


def test_reports_past_the_failed_ranks_last_round_are_recorded_not_committed(storage):
    def loop():
        rank = train.get_context().get_world_rank()
        for step in range(4):
            if rank == 1 and step == 2:
                raise RuntimeError("boom")
            report({"step": step, "rank": rank}, checkpoint=save(step, rank))
            if rank == 0 and step == 3:
                break

    with pytest.raises(TrainingFailedError, match="boom") as info:
        fit(loop, storage)
    result = info.value.result
    assert list(result.metrics_dataframe["step"]) == [0, 1]
    assert result.checkpoint.path.endswith("checkpoint_000001")
    assert not os.path.exists(os.path.join(result.path, "checkpoint_000002"))
    everything = result.all_ranks_metrics_dataframe
    assert sorted(everything[everything["rank"] == 0]["step"]) == [0, 1, 2, 3]


# -- history: attempts, the final trajectory, a file cut by a crash -----------------------------


def resumable_loop(config):
    rank = train.get_context().get_world_rank()
    for step in range(start_step(), config["steps"]):
        checkpoint = save(step, rank) if step % 2 == 0 else None
        report({"step": step}, checkpoint=checkpoint)
        if step == config.get("fail_at") and train.get_context().get_attempt() == 0:
            raise RuntimeError("crash")


def test_a_retry_supersedes_the_rows_after_the_checkpoint(storage):
    result = fit(
        resumable_loop,
        storage,
        config={"steps": 6, "fail_at": 3},
        failure_config=FailureConfig(max_failures=1),
    )
    df = result.metrics_dataframe
    assert list(df["training_iteration"]) == [1, 2, 3, 4, 5, 6]
    assert list(df["step"]) == [0, 1, 2, 3, 4, 5]
    assert list(df["_phalanx_attempt"]) == [1, 1, 1, 2, 2, 2]  # step 3 of attempt 1 was superseded
    everything = result.all_ranks_metrics_dataframe
    assert len(everything) == 2 * (4 + 3)
    assert set(everything.columns) >= {"rank", "_phalanx_attempt", "training_iteration", "step"}
    reloaded = Result.from_path(result.path)
    assert reloaded.metrics_dataframe.equals(df)
    assert reloaded.all_ranks_metrics_dataframe.equals(everything)
    assert reloaded.metrics == result.metrics == {"step": 5}


def test_a_history_file_cut_mid_line_is_repaired_on_resume(storage):
    first = fit(resumable_loop, storage, config={"steps": 3})
    for name in ("metrics.jsonl", "metrics_all_ranks.jsonl"):
        with open(os.path.join(first.path, name), "a") as f:
            f.write('{"step": 99, "trunc')  # the driver died mid-write
    result = fit(resumable_loop, storage, config={"steps": 5})
    for name in ("metrics.jsonl", "metrics_all_ranks.jsonl"):
        with open(os.path.join(result.path, name)) as f:
            rows = [json.loads(line) for line in f]  # every line parses
        assert 99 not in [r["step"] for r in rows]
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3, 4]


# -- resume: visible, and a finished run comes back whole ---------------------------------------


def test_resume_says_so_and_a_finished_run_returns_its_metrics(storage, caplog):
    first = fit(resumable_loop, storage, name="exp", config={"steps": 4})
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        again = fit(resumable_loop, storage, name="exp", config={"steps": 4})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Resuming")]
    assert len(lines) == 1
    assert lines[0].startswith(
        "Resuming run 'exp' from checkpoint_000002; the previous attempt finished."
    )
    # Ray's behaviour: the training function runs again from the latest checkpoint (step 2)
    assert again.metrics == first.metrics == {"step": 3}
    assert again.checkpoint.path.endswith("checkpoint_000002")
    assert list(again.metrics_dataframe["step"]) == [0, 1, 2, 3]


def test_a_finished_run_whose_function_has_nothing_left_returns_the_last_metrics(storage):
    def loop(config):
        for step in range(start_step(), config["steps"]):
            report({"step": step, "loss": 1.0}, checkpoint=save(step))

    first = fit(loop, storage, name="done", workers=1, config={"steps": 3})
    again = fit(loop, storage, name="done", workers=1, config={"steps": 3})
    assert again.metrics == first.metrics == {"step": 2, "loss": 1.0}
    assert again.checkpoint == first.checkpoint


def test_the_previous_outcome_of_a_failed_run_is_named(storage, caplog):
    with pytest.raises(TrainingFailedError):
        fit(resumable_loop, storage, name="f", config={"steps": 5, "fail_at": 2})
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        fit(resumable_loop, storage, name="f", config={"steps": 5})
    assert any(
        "Resuming run 'f' from checkpoint_000002; the previous attempt failed" in r.getMessage()
        for r in caplog.records
    )


# -- default names ------------------------------------------------------------------------------


def test_unnamed_runs_never_share_a_directory(storage):
    def loop():
        report({"x": 1})

    paths = set()
    for _ in range(3):
        trainer = DataParallelTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(storage_path=storage),
        )
        result = trainer.fit()
        assert result.attempts == 1  # not a resume of the previous one
        paths.add(result.path)
    assert len(paths) == 3
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        assert re.fullmatch(r"phalanx_run-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{3}-[0-9a-f]{6}", name)
