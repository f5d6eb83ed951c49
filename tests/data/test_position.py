"""Data position of phalanx's own datasets: what each rank's iterator records, what the driver
combines, and what a resumed attempt reads (ranks simulated in this process)."""

from __future__ import annotations

import json
import logging
import pickle

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phalanx import DataConfig
from phalanx.data import Dataset, from_numpy, read_parquet
from phalanx.data._batching import NUMPY, ShuffleKeys, key_order, shuffle_blocks
from phalanx.data._ingest import shard_datasets, validate_datasets
from phalanx.data._position import combine, describe, pack, progress, unpack
from phalanx.data._source import TableSource
from phalanx.errors import ConfigError


def ids_dataset(n: int, **kwargs) -> dict[str, Dataset]:
    return {"train": from_numpy({"id": np.arange(n), "x": np.arange(n) * 2.0}, **kwargs)}


def split(datasets, world, resume=None, **config):
    shards = shard_datasets(datasets, DataConfig(**config), world, resume)
    return [s["train"] for s in shards]


def as_worker(shard):
    return pickle.loads(cloudpickle.dumps(shard))


def take(iterator, batches: int) -> list[int]:
    return [i for _ in range(batches) for i in next(iterator)["id"].tolist()]


def record_of(driver, workers) -> dict:
    return json.loads(json.dumps(combine(driver, [w.position_state() for w in workers])))


def positions(ranges) -> list[int]:
    return [i for a, b in unpack(ranges) for i in range(a, b)]


def test_ten_rows_at_three_ranks_resumed_at_two_ranks_read_exactly_the_rest():
    data = ids_dataset(10)
    driver = split(data, 3)
    workers = [as_worker(s) for s in driver]
    seen = [take(iter(w.iter_batches(batch_size=2)), 1) for w in workers]
    assert seen == [[0, 1], [3, 4], [6, 7]]
    record = record_of(driver, workers)
    assert (record["epoch"], record["consumed"], record["num_rows"]) == (0, 6, 10)
    # row 9, left out by the equal split at 3 ranks, is part of what is left of the epoch
    assert positions(record["remaining"]) == [2, 5, 8, 9]
    resumed = [as_worker(s) for s in split(data, 2, {"train": record})]
    assert resumed[0].to_pandas()["id"].tolist() == [0, 1, 2, 3, 4]  # the whole shard, as count()
    first = [[i for b in w.iter_batches(batch_size=4) for i in b["id"].tolist()] for w in resumed]
    assert first == [[2, 5], [8, 9]]
    assert [w.position().as_dict() for w in resumed] == [{"epoch": 0, "consumed": 2, "rows": 2}] * 2
    second = [[i for b in w.iter_batches(batch_size=4) for i in b["id"].tolist()] for w in resumed]
    assert second == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # then whole epochs, at the new size
    assert resumed[0].position()["epoch"] == 1


def test_the_position_counts_rows_given_out_not_rows_read_ahead():
    (shard,) = split(ids_dataset(1000), 1)
    assert shard.position_state() is None
    assert shard.position().as_dict() == {"epoch": 0, "consumed": 0, "rows": 1000}
    batches = iter(shard.iter_batches(batch_size=10, prefetch_batches=8))
    take(batches, 3)
    assert shard.position().consumed == 30  # the reader thread is ahead: its rows do not count
    state = shard.position_state()
    assert state == {"pass": 0, "epoch": 0, "consumed": 30, "done": False, "shuffle": None}
    assert shard.position().consumed == 30
    for _ in batches:
        pass
    assert shard.position_state()["done"] and shard.position().consumed == 1000
    dropping = iter(shard.iter_batches(batch_size=300, drop_last=True))
    take(dropping, 1)  # a second pass: epoch 1
    assert shard.position().as_dict() == {"epoch": 1, "consumed": 300, "rows": 1000}
    ahead = iter(shard.iter_batches(batch_size=7))
    take(ahead, 1)  # two passes at once: the one started last counts
    assert shard.position().as_dict() == {"epoch": 2, "consumed": 7, "rows": 1000}
    take(dropping, 1)
    assert shard.position().consumed == 7
    dropping.close(), ahead.close()
    again = as_worker(shard)  # a pickled copy keeps the pass count, not a pass in progress
    assert again.position_state() is None and again.position().epoch == 3


def test_torch_batches_count_their_rows():
    torch = pytest.importorskip("torch")
    (shard,) = split(ids_dataset(50), 1)
    batches = iter(
        shard.iter_torch_batches(
            batch_size=8, local_shuffle_buffer_size=10, local_shuffle_seed=np.int64(4)
        )
    )
    got = torch.cat([next(batches)["id"] for _ in range(3)])
    assert shard.position().consumed == 24 and len(got) == 24
    assert json.loads(json.dumps(shard.position_state()))["shuffle"] == [4, 10]
    batches.close()


@pytest.mark.parametrize("seed", [None, 5])
def test_a_local_shuffle_position_names_exactly_the_rows_given_out(seed):
    data = ids_dataset(3000)
    driver = split(data, 3)
    workers = [as_worker(s) for s in driver]
    iterators = [
        iter(w.iter_batches(batch_size=7, local_shuffle_buffer_size=64, local_shuffle_seed=seed))
        for w in workers
    ]
    seen: set[int] = set()
    for round_ in range(1, 120):
        for r, it in enumerate(iterators):
            if r != 2 or round_ % 3:  # ranks at different places in their shards
                seen.update(take(it, 1))
        if round_ % 17 == 0:
            record = record_of(driver, workers)
            remaining = positions(record["remaining"])
            assert not seen & set(remaining)
            assert sorted(seen | set(remaining)) == list(range(3000))
            assert record["consumed"] == len(seen)
    drawn = workers[0].position_state()["shuffle"][0]
    assert drawn == seed if seed is not None else isinstance(drawn, int)
    iter(workers[0].iter_batches(local_shuffle_buffer_size=64, local_shuffle_seed=seed))
    next_seed = workers[0].position_state()["shuffle"][0]
    assert (next_seed == drawn) == (seed is not None)  # None: a new seed every pass


def test_shuffle_keys_first_rows_match_a_full_sort_across_chunks(monkeypatch):
    monkeypatch.setattr(ShuffleKeys, "CHUNK", 16)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, buffer = int(rng.integers(1, 200)), int(rng.integers(1, 60))
        keys = ShuffleKeys(int(rng.integers(0, 1000)), int(rng.integers(0, 3)), buffer)
        whole = keys(0, n)
        assert np.array_equal(np.concatenate([keys(0, n // 3), keys(n // 3, n)]), whole)
        order = np.argsort(whole, kind="stable")
        k = int(rng.integers(0, n + 1))
        lo, chosen = keys.first(n, k)
        assert np.array_equal(np.concatenate([np.arange(lo), chosen]), np.sort(order[:k]))


def test_equal_keys_are_ordered_by_index_on_every_machine():
    keys = np.array([3.0, 1.0, 3.0, 1.0, 2.0, 3.0])
    assert key_order(keys).tolist() == [1, 3, 4, 0, 2, 5]
    assert key_order(np.array([0.5, 0.25])).tolist() == [1, 0]


@pytest.mark.parametrize("block", [1, 5, 64, 1000])
def test_the_shuffled_order_does_not_depend_on_how_rows_were_read(block):
    n, keys = 500, ShuffleKeys(3, 1, 40)
    rows = np.arange(n)
    blocks = ({"id": rows[i : i + block]} for i in range(0, n, block))
    out = np.concatenate([b["id"] for b in shuffle_blocks(blocks, NUMPY, keys, 8)])
    assert np.array_equal(out, np.argsort(keys(0, n), kind="stable"))
    assert not np.array_equal(out, rows)
    assert np.abs(out - np.arange(n)).max() <= 3 * 40  # a local shuffle: rows stay near


def test_the_epoch_order_after_a_resume_is_the_uninterrupted_runs():
    table = pa.table({"id": np.arange(60)})
    blocks = np.stack([np.arange(12) * 5, np.full(12, 5)], axis=1)
    data = {"train": Dataset(TableSource(table, blocks), shuffle_files=True)}  # seed drawn

    def epoch_order(shards) -> list[int]:
        return [i for s in shards for b in s.iter_batches(batch_size=60) for i in b["id"].tolist()]

    driver = split(data, 2, equal_split=False)
    workers = [as_worker(s) for s in driver]
    epoch_order(workers)
    seen = [i for w in workers for i in take(iter(w.iter_batches(batch_size=4)), 2)]
    record = record_of(driver, workers)  # in epoch 1, 8 rows each, then a failure
    assert (record["epoch"], record["consumed"]) == (1, 16) and record["seed"] is not None
    uninterrupted = [as_worker(s) for s in driver]
    orders = [epoch_order(uninterrupted) for _ in range(3)]
    assert orders[1][:8] + orders[1][30:38] == seen
    resumed = [as_worker(s) for s in split(data, 3, {"train": record}, equal_split=False)]
    rest = epoch_order(resumed)
    assert sorted(rest + seen) == list(range(60))
    assert epoch_order(resumed) == orders[2]  # epoch 2 in the same order, at 3 ranks
    assert resumed[0].position().epoch == 2


def test_a_complete_epoch_resumes_at_the_next_one():
    data = ids_dataset(10)
    driver = split(data, 2)
    workers = [as_worker(s) for s in driver]
    for w in workers:
        list(w.iter_batches(batch_size=3))
    record = record_of(driver, workers)
    assert (record["epoch"], record["consumed"], record["later"]) == (1, 0, [])
    assert describe(record) == "epoch 1, sample 0 of 10" and progress(record) == "epoch 1 0%"
    resumed = split(data, 3, {"train": record})
    assert resumed[0].position().as_dict() == {"epoch": 1, "consumed": 0, "rows": 3}


def test_changed_data_warns_once_naming_the_dataset_and_starts_the_epoch_over(caplog):
    driver = split(ids_dataset(10), 2)
    workers = [as_worker(s) for s in driver]
    for w in workers:
        take(iter(w.iter_batches(batch_size=2)), 1)
    record = record_of(driver, workers)
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        resumed = split(ids_dataset(12), 2, {"train": record})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'train'" in warnings[0] and "10 rows" in warnings[0]
    assert "12" in warnings[0] and "HINT:" in warnings[0]
    assert [w.position().as_dict() for w in resumed] == [{"epoch": 0, "consumed": 0, "rows": 6}] * 2


def test_resume_position_false_starts_every_attempt_at_epoch_zero_as_ray():
    data = ids_dataset(10)
    driver = split(data, 2)
    workers = [as_worker(s) for s in driver]
    for w in workers:
        take(iter(w.iter_batches(batch_size=2)), 1)
    record = record_of(driver, workers)
    for config in ({"resume_position": False}, {"resume_position": {"train": False}}):
        resumed = split(data, 2, {"train": record}, **config)
        assert [w.position().as_dict() for w in resumed] == [
            {"epoch": 0, "consumed": 0, "rows": 5}
        ] * 2
    resumed = split(data, 2, {"train": record}, resume_position={"other": False})
    assert resumed[0].position().as_dict() == {"epoch": 0, "consumed": 0, "rows": 3}
    with pytest.raises(ConfigError, match=r"resume_position='yes'"):
        DataConfig(resume_position="yes")
    with pytest.raises(ConfigError, match=r"(?s)names \['trian'\].*HINT: use the keys"):
        validate_datasets(data, DataConfig(resume_position={"trian": False}))


def test_a_dataset_read_whole_keeps_no_position_but_reports_one():
    shards = shard_datasets(
        {"train": np.arange(4), "valid": {"id": np.arange(6)}},
        DataConfig(datasets_to_split=["train"]),
        2,
    )
    valid = shards[1]["valid"]
    take(iter(valid.iter_batches(batch_size=2)), 1)
    assert valid.position_state() is None
    assert valid.position().as_dict() == {"epoch": 0, "consumed": 2, "rows": 6}


def test_nested_resumes_at_changing_world_sizes_stay_exact():
    data = ids_dataset(97)
    trained: list[int] = []
    record = None
    for world, batches in ((3, 4), (2, 5), (4, 2), (1, None)):
        driver = split(
            data, world, None if record is None else {"train": record}, equal_split=False
        )
        workers = [as_worker(s) for s in driver]
        iterators = [iter(w.iter_batches(batch_size=3)) for w in workers]
        for it in iterators:
            trained += take(it, batches) if batches else [i for b in it for i in b["id"].tolist()]
        record = record_of(driver, workers)
    assert sorted(trained) == list(range(97))
    assert record["epoch"] == 1 and record["remaining"] == [[0, 97]]


def test_a_resumed_parquet_pass_reads_the_scattered_rows_it_was_given(tmp_path):
    table = pa.table({"id": np.arange(400), "x": np.arange(400) * 0.5})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64)
    data = {"train": read_parquet(str(tmp_path / "t.parquet"), shuffle="files")}
    driver = split(data, 2)
    workers = [as_worker(s) for s in driver]
    seen = []
    for w in workers:
        batches = iter(w.iter_batches(batch_size=9, local_shuffle_buffer_size=50))
        seen += take(batches, 6)
        batches.close()
    record = record_of(driver, workers)
    assert len(unpack(record["remaining"])) > 10  # scattered by the local shuffle
    rest = []
    resumed = split(data, 3, {"train": record}, equal_split=False)
    for w in [as_worker(s) for s in resumed]:
        for b in w.iter_batches(batch_size=16):
            assert np.array_equal(b["x"], b["id"] * 0.5)  # whole rows, columns aligned
            rest += b["id"].tolist()
    assert sorted(seen + rest) == list(range(400)) and len(rest) == 400 - len(seen)


def test_describe_names_the_epochs_a_rank_ran_ahead_into():
    record = {
        "epoch": 3,
        "consumed": 91200,
        "num_rows": 120000,
        "remaining": [[0, 28800]],
        "later": [[[10, 120000]]],
    }
    assert describe(record) == "epoch 3, sample 91,200 of 120,000 (and 10 of epoch 4)"
    assert progress(record) == "epoch 3 76%"


def test_many_ranges_are_packed_small_and_read_back_exactly():
    ranges = np.array([(i * 10, i * 10 + 1 + i % 7) for i in range(5000)])
    packed = pack(ranges)
    assert isinstance(packed, str) and len(packed) < len(json.dumps(ranges.tolist())) / 5
    assert np.array_equal(unpack(json.loads(json.dumps(packed))), ranges)
    assert pack(ranges[:3]) == [[0, 1], [10, 12], [20, 23]]


def test_the_rows_an_equal_split_of_the_rest_leaves_out_are_logged(caplog):
    data = ids_dataset(10)
    driver = split(data, 3)
    workers = [as_worker(s) for s in driver]
    for w in workers:
        take(iter(w.iter_batches(batch_size=2)), 1)
    with caplog.at_level(logging.INFO, logger="phalanx"):
        resumed = split(data, 3, {"train": record_of(driver, workers)})
    assert "the 4 rows left of epoch 0 over 3 ranks: 1 per rank; 1 row(s) left out" in caplog.text
    assert [w.position().rows for w in resumed] == [1, 1, 1]
