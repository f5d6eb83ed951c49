"""Property tests: shards are disjoint, cover the data, and are equal when asked."""

from __future__ import annotations

import itertools
import os
import pickle
import tempfile

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx import DataConfig
from phalanx.data import Dataset, read_parquet
from phalanx.data._ingest import shard_datasets
from phalanx.data._plan import Piece, pieces_in_range, rank_range
from phalanx.data._source import TableSource

layouts = st.lists(st.integers(0, 40), max_size=10)  # rows per fragment


def table_source(sizes: list[int]) -> TableSource:
    n = sum(sizes)
    lengths = np.array(sizes, dtype=np.int64)
    blocks = np.stack([np.cumsum(lengths) - lengths, lengths], axis=1)
    return TableSource(pa.table({"id": np.arange(n), "x": np.arange(n) * 0.5}), blocks)


def read_ids(iterator, batch_size: int, drop_last: bool = False) -> tuple[np.ndarray, list[int]]:
    batches = list(iterator.iter_batches(batch_size=batch_size, drop_last=drop_last))
    sizes = [len(b["id"]) for b in batches]
    ids = np.concatenate([b["id"] for b in batches]) if batches else np.array([], dtype=np.int64)
    return ids, sizes


def check_partition(shards, n: int, world: int, batch: int, equal: bool, epoch_count: int = 2):
    for _ in range(epoch_count):
        per_rank = [read_ids(it, batch) for it in shards]
        ids = [ids for ids, _ in per_rank]
        union = np.concatenate(ids)
        assert len(np.unique(union)) == len(union), "shards overlap"
        assert set(union.tolist()) <= set(range(n))
        for it, (rank_ids, sizes) in zip(shards, per_rank):
            assert it.count() == len(rank_ids)
            assert all(s == batch for s in sizes[:-1]) and all(0 < s <= batch for s in sizes)
        if equal:
            assert [len(i) for i in ids] == [n // world] * world
            assert len({len(sizes) for _, sizes in per_rank}) == 1, "batch counts differ"
        else:
            assert sorted(union.tolist()) == list(range(n))


@settings(max_examples=150, deadline=None)
@given(
    sizes=layouts,
    world=st.integers(1, 8),
    batch=st.integers(1, 50),
    equal=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_in_memory_shards_partition_the_rows(sizes, world, batch, equal, shuffle, seed):
    dataset = Dataset(table_source(sizes), shuffle_files=shuffle, seed=seed)
    shards = dataset.streaming_split(world, equal=equal)
    shards = [pickle.loads(cloudpickle.dumps(s)) for s in shards]  # as a worker gets them
    check_partition(shards, sum(sizes), world, batch, equal)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 25)), min_size=1, max_size=4),
    world=st.integers(1, 5),
    batch=st.integers(1, 40),
    shuffle=st.booleans(),
)
def test_parquet_shards_partition_the_rows(files, world, batch, shuffle):
    with tempfile.TemporaryDirectory() as folder:
        start = 0
        for i, (rows, group) in enumerate(files):
            ids = np.arange(start, start + rows)
            pq.write_table(
                pa.table({"id": ids}), os.path.join(folder, f"p{i}.parquet"), row_group_size=group
            )
            start += rows
        dataset = read_parquet(folder, shuffle="files" if shuffle else None)
        for equal in (True, False):
            shards = [
                pickle.loads(cloudpickle.dumps(s))
                for s in dataset.streaming_split(world, equal=equal)
            ]
            check_partition(shards, start, world, batch, equal, epoch_count=1 + shuffle)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 6), batch=st.integers(1, 64))
def test_shard_datasets_splits_named_datasets_and_gives_the_rest_whole(n, world, batch):
    data = {"id": np.arange(n)}
    shards = shard_datasets(
        {"train": data, "valid": data}, DataConfig(datasets_to_split=["train"]), world
    )
    assert len(shards) == world
    check_partition([s["train"] for s in shards], n, world, batch, equal=True, epoch_count=1)
    for shard in shards:
        ids, _ = read_ids(shard["valid"], batch)
        assert ids.tolist() == list(range(n))


@settings(max_examples=200, deadline=None)
@given(sizes=layouts, world=st.integers(1, 9), seed=st.integers(0, 1000))
def test_pieces_of_all_ranks_tile_the_ordered_rows(sizes, world, seed):
    total = sum(sizes)
    order = np.random.default_rng(seed).permutation(len(sizes))
    seen: dict[int, list[tuple[int, int]]] = {}
    for rank in range(world):
        start, stop = rank_range(total, rank, world, equal=False)
        pieces = pieces_in_range(sizes, start, stop, order)
        assert sum(p.num_rows for p in pieces) == stop - start
        for p in pieces:
            assert 0 <= p.start < p.stop <= sizes[p.fragment]
            seen.setdefault(p.fragment, []).append((p.start, p.stop))
    for fragment, size in enumerate(sizes):
        ranges = sorted(seen.get(fragment, []))
        covered = sum(b - a for a, b in ranges)
        assert covered == size and all(a2 >= b1 for (_, b1), (a2, _) in itertools.pairwise(ranges))


def test_equal_split_leaves_out_the_remainder_at_the_end():
    shards = Dataset(table_source([10])).streaming_split(3)
    assert [s.count() for s in shards] == [3, 3, 3]
    assert [read_ids(s, 10)[0].tolist() for s in shards] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_pieces_in_range_crosses_fragments():
    assert pieces_in_range([4, 0, 3], 2, 6) == [Piece(0, 2, 4), Piece(2, 0, 2)]


def test_file_shuffle_changes_each_epoch_and_is_seeded():
    dataset = Dataset(table_source([5] * 20), shuffle_files=True, seed=7)
    (shard,) = dataset.streaming_split(1)
    first, second = read_ids(shard, 100)[0], read_ids(shard, 100)[0]
    assert sorted(first) == sorted(second) == list(range(100))
    assert first.tolist() != second.tolist()
    (again,) = Dataset(table_source([5] * 20), shuffle_files=True, seed=7).streaming_split(1)
    assert read_ids(again, 100)[0].tolist() == first.tolist()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_world_larger_than_rows_gives_empty_shards(world):
    shards = Dataset(table_source([1])).streaming_split(world + 1)
    assert sum(s.count() for s in shards) == 0
    assert all(list(s.iter_batches()) == [] for s in shards)
