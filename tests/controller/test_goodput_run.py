"""Goodput on real worker processes: a run with a slow data source, checkpoints, a slow rank and
a killed rank says where its time went, each part where it was injected, adding up to the wall
time; a clean run shows none of those parts."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pytest

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.collective import barrier
from phalanx.data._dataset import Dataset
from phalanx.data._plan import Piece
from phalanx.data._source import Source
from phalanx.result import Result

try:  # pyarrow imports pandas at its first array: in SlowSource.read, the first batch would
    import pandas  # noqa: F401  wait 1.7-2.8 s for it (counted as data); the workers fork with it
except ImportError:
    pass

pytestmark = pytest.mark.slow

STEPS = 8
DATA_DELAY_S = 0.06  # each batch of the slow source
COMPUTE_S = 0.03
SLOW_RANK_EXTRA_S = 0.12  # rank 1, every step
KILL_AT = 5  # attempt 1: rank 1 dies at this step; the last checkpoint is step 3's


class SlowSource(Source):
    """One row per fragment, each read taking ``delay_s``: a slow file system or decoder."""

    def __init__(self, rows: int, delay_s: float) -> None:
        self.delay_s = delay_s
        self.schema = pa.schema([("x", pa.int64())])
        self.fragment_rows = np.ones(rows, dtype=np.int64)

    def read(self, piece: Piece, batch_rows: int) -> Iterator[pa.RecordBatch]:
        time.sleep(self.delay_s)
        yield pa.record_batch({"x": [piece.fragment] * piece.num_rows}, schema=self.schema)

    def subset(self, fragments: Sequence[int]) -> SlowSource:
        return SlowSource(len(fragments), self.delay_s)

    def describe(self) -> str:
        return "a slow source"


def injected_loop(config):
    context = train.get_context()
    rank, first_attempt = context.get_world_rank(), context.get_attempt() == 0
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    batches = iter(train.get_dataset_shard("train").iter_batches(batch_size=1, prefetch_batches=0))
    for step in range(start, STEPS):
        next(batches)
        time.sleep(COMPUTE_S + (SLOW_RANK_EXTRA_S if rank == 1 else 0.0))
        if first_attempt and rank == 1 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost machine
        if step % 2 == 1:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                ckpt = Checkpoint.from_directory(d) if rank == 0 else None
                train.report({"step": step}, checkpoint=ckpt)
        else:
            train.report({"step": step})
        barrier()  # ranks step together, as an all-reduce makes them


def clean_loop(config):
    for step in range(STEPS):
        time.sleep(COMPUTE_S)
        train.report({"step": step})
        barrier()


def fit(loop, tmp_path, name: str, **kwargs) -> Result:
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=1),
        ),
        **kwargs,
    ).fit()


def check_sum(goodput) -> None:
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s, rel=0.02)
    for attempt in goodput.attempts:
        assert min(attempt.values()) >= 0.0
    for part in goodput.seconds:
        assert sum(a[part] for a in goodput.attempts) <= goodput.seconds[part] + 1e-6


def test_every_injected_part_shows_and_the_parts_add_up_to_the_wall_time(tmp_path, caplog):
    rows = 2 * STEPS
    dataset = Dataset(SlowSource(rows, DATA_DELAY_S))
    caplog.set_level("INFO", logger="phalanx")
    started = time.time()
    result = fit(injected_loop, tmp_path, "injected", datasets={"train": dataset})
    wall = time.time() - started
    goodput = result.goodput
    assert result.attempts == 2
    check_sum(goodput)
    assert goodput.wall_s <= wall
    parts = goodput.seconds
    retrained = STEPS + (STEPS - 4)  # attempt 2 resumes after step 3's checkpoint
    # each at least a third of what was injected (a barrier's polling blurs the straggler's
    # wait, and a loaded machine the rest); the clean run below shows none of them
    assert parts["data"] >= DATA_DELAY_S * retrained / 3, parts
    assert parts["data"] <= 2 * DATA_DELAY_S * retrained, parts  # the waits, nothing else
    assert parts["stragglers"] >= SLOW_RANK_EXTRA_S * retrained / 3, parts
    assert parts["checkpoints"] > 0.0, parts
    # lost: steps 4 and 5 of attempt 1, the detection and the restart of the workers
    assert parts["failures"] >= 2 * (SLOW_RANK_EXTRA_S + COMPUTE_S), parts
    assert parts["startup"] > 0.0 and parts["productive"] > 0.0, parts
    first, second = goodput.attempts
    assert first["failures"] > 0.0 and second["failures"] > 0.0  # rolled back, then restarted
    assert second["startup"] == 0.0  # a restart after a failure is lost to it, not start-up
    # the same breakdown in run.json, in Result.from_path, and in the end-of-fit line
    record = json.loads((tmp_path / "injected" / "run.json").read_text())
    assert record["goodput"]["seconds"] == pytest.approx(parts)
    assert Result.from_path(result.path).goodput == goodput
    assert any(r.getMessage().endswith(goodput.summary()) for r in caplog.records)
    assert goodput.summary().startswith(f"goodput {goodput.goodput * 100:.1f} %: ")


def test_a_clean_run_has_no_checkpoint_data_or_failure_time(tmp_path):
    goodput = fit(clean_loop, tmp_path, "clean").goodput
    check_sum(goodput)
    parts = goodput.seconds
    assert parts["checkpoints"] == parts["data"] == parts["failures"] == 0.0
    # ranks in step: only scheduling jitter between their reports (the injected run: ~30 %)
    assert parts["stragglers"] < 0.15 * goodput.wall_s, parts
    assert len(goodput.attempts) == 1
