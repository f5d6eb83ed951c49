"""A mixed dataset through a real trainer: a rank killed mid-epoch, the attempt resumed from
the checkpoint, then the run's checkpoint resumed by a trainer of another size; every row of
each source trained once per epoch, and ``phalanx show`` gives each source's progress."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tempfile
from collections import Counter
from typing import Any

import numpy as np
import pytest

import phalanx as train
import phalanx.data as pdata
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.cli._main import main as cli_main
from phalanx.errors import TrainingFailedError

SIZES = (90, 30)
BATCH = 4
EPOCHS = 2

pytestmark = pytest.mark.slow


def mixed() -> pdata.Dataset:
    a = pdata.from_numpy({"id": np.arange(SIZES[0])})
    b = pdata.from_numpy({"id": np.arange(SIZES[1]) + 1000})
    return a.mix(b, weights=[0.75, 0.25])


def load(checkpoint: Checkpoint | None) -> list[list[int]]:
    ids: list[list[int]] = [[] for _ in range(EPOCHS)]
    if checkpoint is None:
        return ids
    with checkpoint.as_directory() as d:
        for name in sorted(os.listdir(d)):
            if name.startswith("ids_"):
                with open(os.path.join(d, name)) as f:
                    for e, got in enumerate(json.load(f)):
                        ids[e] += got
    return ids


def train_ids(config: dict[str, Any]) -> None:
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    shard = train.get_dataset_shard("train")
    inherited = load(train.get_checkpoint())
    mine = inherited if rank == 0 else [[] for _ in range(EPOCHS)]
    step = 0
    for epoch in range(ctx.get_data_position("train").epoch, EPOCHS):
        for batch in shard.iter_batches(batch_size=BATCH):
            if ctx.get_attempt() == 0 and (rank, step) == (config["kill_rank"], config["kill"]):
                os.kill(os.getpid(), signal.SIGKILL)
            mine[epoch] += [int(i) for i in batch["id"]]
            step += 1
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, f"ids_{rank}.json"), "w") as f:
                    json.dump(mine, f)
                checkpoint = Checkpoint.from_directory(d) if step % 2 == 0 else None
                train.report({"epoch": epoch}, checkpoint=checkpoint)
            if step == config.get("stop_after"):
                raise RuntimeError("stopped on purpose")


def trainer(tmp_path, workers: int, name: str, **config: Any) -> DataParallelTrainer:
    resume = config.pop("resume_from_checkpoint", None)
    return DataParallelTrainer(
        train_ids,
        train_loop_config={"kill_rank": -1, "kill": -1, **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=0 if "stop_after" in config else 1),
            verbose=0,
        ),
        datasets={"train": mixed()},
        resume_from_checkpoint=resume,
    )


def assert_each_row_once(checkpoint: Checkpoint | None, workers: tuple[int, ...]) -> None:
    every = set(range(SIZES[0])) | set(range(1000, 1000 + SIZES[1]))
    for epoch, got in enumerate(load(checkpoint)):
        counts = Counter(got)
        assert [i for i, n in counts.items() if n > 1] == [], f"epoch {epoch}: trained twice"
        # only the equal split's remainders (fewer than a world size per source) are left out
        assert len(every - set(counts)) <= len(SIZES) * sum(w - 1 for w in workers), epoch


def test_a_mixed_dataset_resumes_exactly_after_a_failure_and_at_another_size(tmp_path):
    result = trainer(tmp_path, 2, "killed", kill_rank=1, kill=7).fit()
    assert result.attempts == 2
    assert_each_row_once(result.checkpoint, (2,))

    with pytest.raises(TrainingFailedError) as failed:
        trainer(tmp_path, 3, "stopped", stop_after=5).fit()
    checkpoint = failed.value.result.checkpoint
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["show", str(tmp_path / "stopped")]) == 0
    assert "train: epoch 0, source 0 " in out.getvalue()
    assert ", source 1 " in out.getvalue()

    resumed = trainer(tmp_path, 2, "resumed", resume_from_checkpoint=checkpoint).fit()
    assert_each_row_once(resumed.checkpoint, (3, 2))


def scaled(config: dict[str, Any]) -> None:
    shard = train.get_dataset_shard("train")
    ids = sorted(int(i) for b in shard.iter_batches(batch_size=BATCH) for i in b["id"])
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"ids_{train.get_context().get_world_rank()}.json"), "w") as f:
            json.dump([ids, []], f)
        train.report({}, checkpoint=Checkpoint.from_directory(d))


def test_a_preprocessor_reads_every_source_of_a_mix(tmp_path):
    from phalanx.preprocess import BatchMapper

    result = DataParallelTrainer(
        scaled,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="pre", storage_path=str(tmp_path), verbose=0),
        datasets={"train": mixed()},
        preprocessor=BatchMapper(lambda df: df.assign(id=df["id"] * 10), batch_format="pandas"),
    ).fit()
    (ids, _) = load(result.checkpoint)
    assert sorted(ids) == [10 * i for i in [*range(SIZES[0]), *range(1000, 1000 + SIZES[1])]]
