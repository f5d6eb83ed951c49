"""Exact resume of a phalanx dataset through an elastic group on a fake multi-node Ray cluster:
4 workers lose a node mid-epoch and continue at 2 (in place), then grow back to 4 when a node
joins; every id is trained exactly once per epoch, as the model's own state says.

The "model" is the ids it trained: each rank writes the ids it trained since the function
started, per epoch, into its part of every checkpoint (rank 0 also carries what the checkpoint
it started from held). Rounds after a group's last checkpoint are lost with the group, as a
model's updates are, so the final checkpoint holds what training survived.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import WorkerNodes, elastic_group, fit_in_thread, fit_result, wait_until

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig

pytestmark = pytest.mark.slow

ROWS = 96
BATCH = 4  # 16 ids a round at 4 workers, 8 at 2: every split below is even
EPOCHS = 3
EVERY = 3  # a checkpoint every 3 rounds of a group, and one at the end
FULL = 4
FIRST_HOLD = 10  # attempt 0 (4 workers): checkpoint at step 9 (epoch 1, 48 of 96), 1 more step
SHRUNK_HOLD = 4  # the 2-worker group: checkpoint at step 3 (epoch 1, 72 of 96), 1 more step
HOLD_S = 120.0


def load_model(checkpoint: Checkpoint | None) -> list[list[int]]:
    """The ids trained per epoch, over every rank's part of ``checkpoint``."""
    ids: list[list[int]] = [[] for _ in range(EPOCHS)]
    if checkpoint is None:
        return ids
    with checkpoint.as_directory() as d:
        for name in sorted(os.listdir(d)):
            if name.startswith("ids_"):
                part = json.loads(Path(d, name).read_text())
                for epoch, trained in enumerate(part):
                    ids[epoch] += trained
    return ids


def train_ids(config: dict[str, Any]) -> None:
    """One batch a round per rank from the epoch the data resumes in. Attempt 0 holds after
    step FIRST_HOLD (a node is removed under it); a group smaller than FULL holds after step
    SHRUNK_HOLD (until a node joins and the group is restarted larger). Each hold is announced
    by ``hold<attempt>-rank<r>`` in ``config["dir"]``."""
    ctx = train.get_context()
    rank, size, attempt = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_attempt()
    shard = train.get_dataset_shard("train")
    inherited = load_model(train.get_checkpoint())
    mine = inherited if rank == 0 else [[] for _ in range(EPOCHS)]
    step = 0
    start_epoch = epoch = ctx.get_data_position("train").epoch
    for epoch in range(start_epoch, EPOCHS):
        for batch in shard.iter_batches(batch_size=BATCH):
            mine[epoch] += [int(i) for i in batch["id"]]
            step += 1
            report(ctx, mine, step, step % EVERY == 0)
            if (attempt == 0 and step == FIRST_HOLD) or (size < FULL and step == SHRUNK_HOLD):
                Path(config["dir"], f"hold{attempt}-rank{rank}").touch()
                deadline = time.monotonic() + HOLD_S  # torn down (or the test fails) before
                while time.monotonic() < deadline:
                    time.sleep(0.05)
    report(ctx, mine, step, True)


def report(ctx: Any, ids: list[list[int]], step: int, save: bool) -> None:
    metrics = {"step": step, "size": ctx.get_world_size()}
    if not save:
        train.report(metrics)
        return
    rank = ctx.get_world_rank()
    with tempfile.TemporaryDirectory() as d:
        Path(d, f"ids_{rank}.json").write_text(json.dumps(ids))
        if rank == 0:
            tag = {"attempt": ctx.get_attempt(), "step": step}
            Path(d, "tag.json").write_text(json.dumps(tag))
        train.report(metrics, checkpoint=Checkpoint.from_directory(d))


def committed(run: Path, attempt: int, step: int) -> bool:
    """Whether the checkpoint of ``attempt``'s ``step`` is committed (a checkpoint directory
    appears only once committed, with the data position stored in it)."""
    for tag in run.glob("checkpoint_*/tag.json"):
        if json.loads(tag.read_text()) == {"attempt": attempt, "step": step}:
            return True
    return False


def holding(directory: Path, attempt: int, size: int) -> bool:
    return len(list(directory.glob(f"hold{attempt}-rank*"))) == size


@pytest.mark.timeout(300)
def test_an_elastic_shrink_and_grow_trains_every_id_once_per_epoch(
    nodes: WorkerNodes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes.add({"elastic": 2})
    doomed = nodes.add({"elastic": 2})
    nodes.wait()
    run = tmp_path / "runs" / "elastic_ids"
    trainer = DataParallelTrainer(
        train_ids,
        train_loop_config={"dir": str(tmp_path)},
        scaling_config=elastic_group(FULL),
        run_config=RunConfig(
            name="elastic_ids",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
            verbose=0,
        ),
        datasets={"train": {"id": np.arange(ROWS)}},
        dataset_config=train.DataConfig(equal_split=False),
    )
    with caplog.at_level(logging.INFO):
        runner, outcome = fit_in_thread(trainer)
        try:
            wait_until(
                lambda: committed(run, 0, 9) and holding(tmp_path, 0, FULL), 120, "attempt 0"
            )
            nodes.kill(doomed)
            wait_until(lambda: committed(run, 1, 3) and holding(tmp_path, 1, 2), 120, "2 workers")
            nodes.add({"elastic": 2})
            result = fit_result(runner, outcome, 120)
        finally:
            runner.join(60)
    assert result.error is None and result.attempts == 3  # the loss, then the growth

    rows = result.all_ranks_metrics_dataframe
    sizes = rows.groupby("_phalanx_attempt")["size"].agg(["min", "max"])
    assert sizes.values.tolist() == [[4, 4], [2, 2], [4, 4]]  # shrunk, then grown back
    for where in ("epoch 1, sample 48 of 96", "epoch 1, sample 72 of 96"):  # both mid-epoch
        assert f"Resuming data from the checkpoint: dataset 'train' at {where}" in caplog.text

    for epoch, trained in enumerate(load_model(result.checkpoint)):
        counts = Counter(trained)
        twice = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(ROWS)) - set(counts))
        assert (twice, missing) == ([], []), f"epoch {epoch}: trained twice / never"
