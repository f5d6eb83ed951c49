"""Exact resume of data through real trainers on local worker processes: a rank killed at a
random step, a checkpoint resumed by a trainer of another size, the opt out, what the user sees.

The "model" is the ids it trained: each rank writes the ids it trained since the start, per
epoch, into its part of every checkpoint (rank 0 also carries what the checkpoint it started
from held), so the final checkpoint says what training survived. Rounds after the last
checkpoint are lost with a failure, as a model's updates are: exactly once means every id in
every epoch of the final checkpoint once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import signal
import tempfile
from collections import Counter
from typing import Any

import pytest

import phalanx as train
from phalanx import (
    Checkpoint,
    DataConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from phalanx.cli._main import main as cli_main
from phalanx.errors import TrainingFailedError
from phalanx.preprocess import BatchMapper

ROWS = 60
BATCH = 5
EPOCHS = 2


def load_model(checkpoint: Checkpoint | None) -> tuple[int, list[list[int]]]:
    """The epoch the checkpoint was taken in and the ids trained per epoch, over every rank."""
    if checkpoint is None:
        return 0, [[] for _ in range(EPOCHS)]
    ids: list[list[int]] = [[] for _ in range(EPOCHS)]
    epoch = 0
    with checkpoint.as_directory() as d:
        for name in sorted(os.listdir(d)):
            if name.startswith("ids_"):
                with open(os.path.join(d, name)) as f:
                    part = json.load(f)
                epoch = max(epoch, part["epoch"])
                for e, trained in enumerate(part["ids"]):
                    ids[e] += trained
    return epoch, ids


def train_ids(config: dict[str, Any]) -> None:
    """Checkpoint every ``every`` rounds; attempt 0's ``kill_rank`` SIGKILLs itself at its step
    ``kill_step``; ``stop_after`` ends the run with an error after that many rounds."""
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    shard = train.get_dataset_shard("train")
    _, inherited = load_model(train.get_checkpoint())
    mine: list[list[int]] = inherited if rank == 0 else [[] for _ in range(EPOCHS)]
    step = 0
    start_epoch = epoch = ctx.get_data_position("train").epoch  # the epoch the data resumes in
    for epoch in range(start_epoch, EPOCHS):
        for batch in shard.iter_batches(batch_size=BATCH):
            if ctx.get_attempt() == 0 and (rank, step) == (
                config["kill_rank"],
                config["kill_step"],
            ):
                os.kill(os.getpid(), signal.SIGKILL)
            mine[epoch] += [int(i) for i in batch["id"]]
            step += 1
            save = step % config["every"] == 0
            report(rank, epoch, mine, save)
            if step == config.get("stop_after"):
                raise RuntimeError("stopped on purpose")
    report(rank, epoch, mine, True)


def report(rank: int, epoch: int, ids: list[list[int]], save: bool) -> None:
    if not save:
        train.report({"epoch": epoch})
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"ids_{rank}.json"), "w") as f:
            json.dump({"epoch": epoch, "ids": ids}, f)
        train.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d))


def trainer(tmp_path, workers: int, config: dict[str, Any], **kwargs: Any) -> DataParallelTrainer:
    data_config = kwargs.pop("data_config", DataConfig(equal_split=False))
    failures = kwargs.pop("max_failures", 1)
    engine = kwargs.pop("engine", None)
    return DataParallelTrainer(
        train_ids,
        train_loop_config={"kill_rank": -1, "kill_step": -1, "every": 2, **config},
        scaling_config=ScalingConfig(num_workers=workers, engine=engine),
        run_config=RunConfig(
            name=kwargs.pop("name", "ids"),
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=failures),
            verbose=0,
        ),
        datasets={"train": {"id": list(range(ROWS))}},
        dataset_config=data_config,
        **kwargs,
    )


def assert_each_id_once_per_epoch(checkpoint: Checkpoint | None) -> None:
    _, ids = load_model(checkpoint)
    for epoch, trained in enumerate(ids):
        counts = Counter(trained)
        twice = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(ROWS)) - set(counts))
        assert (twice, missing) == ([], []), f"epoch {epoch}: trained twice / never"


@pytest.mark.parametrize("seed", range(10))
def test_a_rank_killed_at_a_random_step_loses_and_repeats_no_sample(tmp_path, caplog, seed):
    chance = random.Random(seed)
    workers = chance.choice([2, 3])
    steps = EPOCHS * ROWS // (workers * BATCH)
    config = {"kill_rank": chance.randrange(workers), "kill_step": chance.randrange(2, steps)}
    with caplog.at_level(logging.WARNING):
        result = trainer(tmp_path, workers, config).fit()
    assert result.attempts == 2  # the kill happened and the run resumed from a checkpoint
    assert "Resuming data from the checkpoint: dataset 'train' at epoch" in caplog.text
    assert_each_id_once_per_epoch(result.checkpoint)


def per_epoch(config: dict[str, Any]) -> None:
    """Ray's documented loop: a checkpoint per epoch (here at its last batch, inside the loop),
    and a resume starts at the checkpoint's epoch + 1. Attempt 0's rank 1 dies in epoch 1."""
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    shard = train.get_dataset_shard("train")
    checkpoint = train.get_checkpoint()
    saved, inherited = load_model(checkpoint)
    mine = inherited if rank == 0 else [[] for _ in range(EPOCHS)]
    for epoch in range(saved + 1 if checkpoint else 0, EPOCHS):
        for batch in shard.iter_batches(batch_size=BATCH):
            if (ctx.get_attempt(), rank, epoch) == (0, 1, 1):
                os.kill(os.getpid(), signal.SIGKILL)
            mine[epoch] += [int(i) for i in batch["id"]]
            position = shard.position()
            report(rank, epoch, mine, position.consumed == position.rows)


def test_a_checkpoint_at_the_last_batch_of_an_epoch_resumes_at_the_next_epoch(tmp_path):
    result = DataParallelTrainer(
        per_epoch,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="epochs",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=1),
            verbose=0,
        ),
        datasets={"train": {"id": list(range(ROWS))}},
    ).fit()
    assert result.attempts == 2
    assert_each_id_once_per_epoch(result.checkpoint)  # epoch 1 whole, not an empty pass


def stopped_run(tmp_path, caplog, workers: int = 3, **kwargs: Any) -> Checkpoint:
    """A run that stops with an error in its first epoch, after a checkpoint at round 2 (30 of
    the 60 ids trained with 3 workers), and the checkpoint it left."""
    with pytest.raises(TrainingFailedError) as failed:
        trainer(tmp_path, workers, {"stop_after": 3}, max_failures=0, **kwargs).fit()
    checkpoint = failed.value.result.checkpoint
    assert checkpoint is not None
    epoch, ids = load_model(checkpoint)
    assert (epoch, len(ids[0])) == (0, 2 * workers * BATCH)
    return checkpoint


@pytest.mark.parametrize("engine", ["local", "thread"])  # thread: ranks share one process
def test_resume_from_checkpoint_into_a_trainer_of_another_size_continues_the_epoch(
    tmp_path, caplog, engine
):
    checkpoint = stopped_run(tmp_path, caplog)
    resumed = trainer(
        tmp_path, 2, {}, name="resumed", resume_from_checkpoint=checkpoint, engine=engine
    )
    with caplog.at_level(logging.WARNING):
        result = resumed.fit()
    assert_each_id_once_per_epoch(result.checkpoint)
    assert "Resuming data from the checkpoint: dataset 'train' at epoch 0" in caplog.text

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["show", str(tmp_path / "ids")]) == 0
    assert "  train: epoch 0, sample 30 of 60 (50%)\n" in out.getvalue()


def test_a_run_started_again_with_its_name_continues_the_epoch(tmp_path, caplog):
    # through a preprocessor: the workers read wrapped shards, the driver combines on its own
    same = BatchMapper(lambda df: df, batch_format="pandas")
    stopped_run(tmp_path, caplog, preprocessor=same)
    with caplog.at_level(logging.WARNING):
        result = trainer(tmp_path, 3, {}, name="ids", preprocessor=same).fit()  # fit() again
    assert_each_id_once_per_epoch(result.checkpoint)
    assert "Resuming data from the checkpoint: dataset 'train' at epoch 0, sample 30 of 60" in (
        caplog.text
    )


def test_resume_position_false_starts_the_epoch_over_as_ray_does(tmp_path, caplog):
    checkpoint = stopped_run(tmp_path, caplog)
    no_resume = DataConfig(equal_split=False, resume_position=False)
    result = trainer(
        tmp_path, 2, {}, name="over", resume_from_checkpoint=checkpoint, data_config=no_resume
    ).fit()
    _, ids = load_model(result.checkpoint)
    counts = Counter(ids[0])
    assert sorted(counts.values()) == [1] * 30 + [2] * 30  # the 30 trained before: twice
    assert "Resuming data" not in caplog.text
