"""Property: whatever fails and whatever the world size after it, the training that survives
sees every row exactly once per epoch (``equal_split=False``), or at most once with fewer rows
left out than the world size that finished the epoch (``equal_split=True``).

A run is simulated in this process: an attempt splits the dataset with ``shard_datasets`` (the
workers get pickled copies, the driver keeps the originals for ``combine``); every round each
rank takes one batch and reports its ``position_state()``; every ``k`` rounds a checkpoint
stores ``combine()`` of that round (through JSON, as on disk); a failure at a random round
throws away what was consumed after the last checkpoint, and the next attempt, at a new world
size, resumes from that checkpoint's record. The range operations the driver uses are checked
against Python sets."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import Iterator

import cloudpickle
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx import DataConfig
from phalanx.data import Dataset
from phalanx.data._ingest import shard_datasets
from phalanx.data._plan import (
    map_ranges,
    merge_ranges,
    ranges_from_indices,
    subtract_ranges,
    take_ranges,
)
from phalanx.data._position import combine
from phalanx.data._source import TableSource

EPOCHS = 2


def dataset(sizes: list[int], shuffle_files: bool, seed: int | None) -> Dataset:
    lengths = np.array(sizes, dtype=np.int64)
    blocks = np.stack([np.cumsum(lengths) - lengths, lengths], axis=1).reshape(-1, 2)
    table = pa.table({"id": np.arange(int(lengths.sum()))})
    return Dataset(TableSource(table, blocks), shuffle_files=shuffle_files, seed=seed)


def rank_stream(shard, batch: int, buffer: int | None, seed: int | None) -> Iterator[tuple]:
    """What a training loop does: passes until epoch EPOCHS, from the epoch the shard is at."""
    epoch = shard.position().epoch
    while epoch < EPOCHS:
        for b in shard.iter_batches(
            batch_size=batch,
            prefetch_batches=0,
            local_shuffle_buffer_size=buffer,
            local_shuffle_seed=seed,
        ):
            yield epoch, b["id"].tolist()
        epoch += 1


def attempt(ds, record, world, fail_at, every, equal, reading) -> tuple[dict | None, list]:
    """One attempt from ``record``: (the last checkpoint's record, what it committed)."""
    resume = None if record is None else {"train": record}
    config = DataConfig(equal_split=equal)
    driver = [s["train"] for s in shard_datasets({"train": ds}, config, world, resume)]
    workers = [pickle.loads(cloudpickle.dumps(s)) for s in driver]
    streams = [rank_stream(w, *reading) for w in workers]
    committed, pending = [], []
    live = [True] * world
    round_ = 0
    while any(live) and (fail_at is None or round_ < fail_at):
        round_ += 1
        for r, stream in enumerate(streams):
            got = next(stream, None) if live[r] else None
            live[r] = got is not None
            if got is not None:
                pending.append(got)
        if round_ % every == 0 or not any(live):
            states = [w.position_state() for w in workers]
            record = json.loads(json.dumps(combine(driver, states)))  # as stored on disk
            committed, pending = committed + pending, []
    for stream in streams:
        stream.close()
    return record, committed  # the rounds after the last checkpoint are lost


def run(ds, worlds, failures, every, equal, reading) -> dict[int, Counter]:
    """The ids whose training survived, per epoch."""
    survived: dict[int, Counter] = {e: Counter() for e in range(EPOCHS)}
    record = None
    for i, world in enumerate(worlds):
        fail_at = failures[i] if i < len(worlds) - 1 else None
        record, committed = attempt(ds, record, world, fail_at, every, equal, reading)
        for epoch, ids in committed:
            survived[epoch].update(ids)
    return survived


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    worlds=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    failures=st.lists(st.integers(1, 12), min_size=3, max_size=3),
    every=st.integers(1, 4),
    batch=st.integers(1, 5),
    equal=st.booleans(),
    shuffle_files=st.booleans(),
    buffer=st.sampled_from([None, None, 1, 3, 10]),
    seeds=st.tuples(st.none() | st.integers(0, 99), st.none() | st.integers(0, 99)),
)
def test_every_row_is_trained_once_per_epoch_across_failures_and_resizes(
    sizes, worlds, failures, every, batch, equal, shuffle_files, buffer, seeds
):
    file_seed, local_seed = seeds
    ds = dataset(sizes, shuffle_files, file_seed)
    n = ds.count()
    survived = run(ds, worlds, failures, every, equal, (batch, buffer, local_seed))
    for epoch, ids in survived.items():
        assert all(count == 1 for count in ids.values()), f"epoch {epoch}: a row trained twice"
        assert set(ids) <= set(range(n))
        if equal:
            # rows the equal split left out: fewer than the world size that finished the epoch
            assert n - len(ids) < max(worlds), f"epoch {epoch}: {n - len(ids)} rows left out"
        else:
            assert sorted(ids) == list(range(n)), f"epoch {epoch}: rows missing"


def ranges_of(ids: set[int]) -> np.ndarray:
    return ranges_from_indices(np.array(sorted(ids), dtype=np.int64))


id_sets = st.sets(st.integers(0, 80), max_size=60)


@settings(max_examples=300, deadline=None)
@given(base=id_sets, minus=st.lists(st.tuples(st.integers(0, 90), st.integers(0, 90))), cut=id_sets)
def test_range_operations_agree_with_sets(base, minus, cut):
    bounds = [(a, b) for a, b in minus]  # unsorted, overlapping, some empty
    minus_ids = {i for a, b in bounds for i in range(a, b)}
    assert positions_of(merge_ranges(bounds)) == sorted(minus_ids)
    assert positions_of(subtract_ranges(ranges_of(base), bounds)) == sorted(base - minus_ids)
    listed = sorted(base)
    lo, hi = len(listed) // 3, 2 * len(listed) // 3
    assert positions_of(take_ranges(ranges_of(base), lo, hi)) == listed[lo:hi]
    items = {i for i in cut if i < len(listed)}
    assert positions_of(map_ranges(ranges_of(base), ranges_of(items))) == [
        listed[i] for i in sorted(items)
    ]


def positions_of(ranges) -> list[int]:
    return [i for a, b in ranges for i in range(a, b)]
