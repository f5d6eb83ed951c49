"""DataIterator: batch formats, torch batches, shuffling, epochs, the prefetch thread."""

from __future__ import annotations

import gc
import glob
import pickle
import threading

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from phalanx import DataConfig
from phalanx.data import (
    DataIterator,
    from_items,
    from_numpy,
    from_pandas,
    read_parquet,
)
from phalanx.data import _source as source_module
from phalanx.data._ingest import shard_datasets

torch = pytest.importorskip("torch")

N = 100


@pytest.fixture
def shard() -> DataIterator:
    return from_numpy({"id": np.arange(N), "x": np.arange(N, dtype=np.float32)}).iterator()


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "phalanx-prefetch"]


def test_numpy_pandas_pyarrow_formats(shard):
    batches = list(shard.iter_batches(batch_size=30))
    assert [len(b["id"]) for b in batches] == [30, 30, 30, 10]
    assert isinstance(batches[0]["x"], np.ndarray) and batches[0]["x"].dtype == np.float32
    frame = next(shard.iter_batches(batch_size=30, batch_format="pandas"))
    assert isinstance(frame, pd.DataFrame) and list(frame["id"]) == list(range(30))
    table = next(shard.iter_batches(batch_size=30, batch_format="pyarrow"))
    assert isinstance(table, pa.Table) and table.num_rows == 30
    assert [len(b["id"]) for b in shard.iter_batches(batch_size=30, drop_last=True)] == [30] * 3
    assert sum(len(b["id"]) for b in shard.iter_batches(batch_size=None)) == N


def test_torch_batches_with_dtypes(shard):
    batch = next(shard.iter_torch_batches(batch_size=16, dtypes={"x": torch.float64}))
    assert batch["x"].dtype == torch.float64 and batch["id"].dtype == torch.int64
    assert batch["x"].shape == (16,) and batch["x"].device.type == "cpu"
    batch = next(shard.iter_torch_batches(batch_size=16, dtypes=torch.float16))
    assert batch["id"].dtype == torch.float16
    batch["x"] += 1  # writable, no warning about read-only numpy memory


def test_torch_collate_fn_gets_numpy_and_rejects_dtypes(shard):
    def collate(batch):
        return torch.as_tensor(np.stack([batch["x"], batch["id"]], axis=1))

    out = list(shard.iter_torch_batches(batch_size=40, collate_fn=collate))
    assert [b.shape for b in out] == [(40, 2), (40, 2), (20, 2)]
    with pytest.raises(ValueError, match="collate_fn cannot be used with dtypes"):
        shard.iter_torch_batches(collate_fn=collate, dtypes=torch.float32)


def test_string_columns_name_the_column_in_torch():
    shard = from_items([{"name": "a", "v": 1}]).iterator()
    with pytest.raises(TypeError, match=r"(?s)Column 'name'.*HINT"):
        next(shard.iter_torch_batches())


def test_local_shuffle_is_a_seeded_permutation_that_changes_each_epoch(shard):
    def epoch(it):
        return np.concatenate(
            [
                b["id"]
                for b in it.iter_batches(
                    batch_size=8, local_shuffle_buffer_size=20, local_shuffle_seed=3
                )
            ]
        )

    first, second = epoch(shard), epoch(shard)
    assert sorted(first) == list(range(N)) and sorted(second) == list(range(N))
    assert first.tolist() != list(range(N)) and first.tolist() != second.tolist()
    fresh = from_numpy({"id": np.arange(N), "x": np.zeros(N)}).iterator()
    assert epoch(fresh).tolist() == first.tolist()


def test_count_materialize_to_pandas(shard):
    assert shard.count() == N
    assert shard.to_pandas()["id"].tolist() == list(range(N))
    memory = shard.materialize()
    assert memory.count() == N and memory.columns() == ["id", "x"]
    assert "100 rows" in shard.stats()


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_every_prefetch_depth_gives_the_same_batches(shard, prefetch):
    batches = shard.iter_batches(batch_size=7, prefetch_batches=prefetch)
    assert [i for b in batches for i in b["id"].tolist()] == list(range(N))


def test_each_iteration_of_the_batches_is_a_new_epoch_as_in_ray(shard):
    batches = shard.iter_torch_batches(batch_size=30)  # what Hugging Face's Trainer re-reads
    epochs = [[i for b in batches for i in b["id"].tolist()] for _ in range(2)]
    assert epochs[0] == epochs[1] == list(range(N))
    ongoing = shard.iter_batches(batch_size=30)
    head = next(ongoing)  # next() starts a pass; a for loop after it finishes that pass
    assert [len(head["id"])] + [len(b["id"]) for b in ongoing] == [30, 30, 30, 10]
    assert sum(len(b["id"]) for b in ongoing) == N  # and the next loop is a new epoch


def test_abandoned_iteration_stops_the_prefetch_thread():
    big = from_numpy({"x": np.zeros(200_000)}).iterator()
    batches = big.iter_batches(batch_size=10)
    next(batches)
    assert prefetch_threads()
    del batches
    gc.collect()
    assert not prefetch_threads()  # joined when the generator was closed


def test_errors_in_the_prefetch_thread_reach_the_caller(shard):
    def collate(batch):
        raise KeyError("bad column")

    with pytest.raises(KeyError, match="bad column"):
        list(shard.iter_torch_batches(collate_fn=collate))
    assert not prefetch_threads()


def test_bad_arguments_are_refused(shard):
    with pytest.raises(ValueError, match="batch_format='arrow'"):
        shard.iter_batches(batch_format="arrow")
    with pytest.raises(ValueError, match="batch_size=0"):
        shard.iter_batches(batch_size=0)
    with pytest.raises(ValueError, match="local_shuffle_buffer_size=-1"):
        shard.iter_batches(local_shuffle_buffer_size=-1)


def test_large_in_memory_tables_travel_through_one_shared_file(monkeypatch):
    monkeypatch.setattr(source_module, "INLINE_BYTES", 1024)
    df = pd.DataFrame({"id": np.arange(10_000), "x": np.ones(10_000)})
    shards = shard_datasets({"train": df}, DataConfig(), 4)
    payloads = [cloudpickle.dumps(s) for s in shards]
    assert max(len(p) for p in payloads) < 4096  # a path, not the rows
    assert len(glob.glob(f"{source_module._spill_root}/*.arrow")) == 1
    workers = [pickle.loads(p) for p in payloads]
    del shards
    gc.collect()
    assert glob.glob(f"{source_module._spill_root}/*.arrow") == []  # removed; workers keep a map
    ids = [i for w in workers for b in w["train"].iter_batches(batch_size=999) for i in b["id"]]
    assert ids == list(range(10_000))


def test_small_in_memory_shards_pickle_only_their_rows():
    df = pd.DataFrame({"x": np.ones(100_000)})
    payloads = [len(cloudpickle.dumps(s)) for s in from_pandas(df).streaming_split(4)]
    assert all(p < 800_000 / 4 + 4096 for p in payloads)


def test_torch_batches_cross_row_groups_and_keep_every_column(tmp_path):
    import pyarrow.parquet as pq

    n = 53
    images = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)
    table = pa.table(
        {
            "id": np.arange(n),
            "f": np.arange(n, dtype=np.float32) / 2,
            "g": np.arange(n, dtype=np.float32),
            "flag": np.arange(n) % 2 == 0,
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    (shard,) = read_parquet(str(tmp_path / "t.parquet")).streaming_split(1)
    batches = list(shard.iter_torch_batches(batch_size=10, dtypes={"g": torch.float64}))
    assert [len(b["id"]) for b in batches] == [10] * 5 + [3]
    assert list(batches[0]) == ["id", "f", "g", "flag", "image"]
    ids = torch.cat([b["id"] for b in batches])
    assert ids.tolist() == list(range(n))
    assert torch.equal(torch.cat([b["f"] for b in batches]), ids.float() / 2)
    assert batches[0]["g"].dtype == torch.float64 and batches[0]["flag"].dtype == torch.bool
    assert torch.equal(torch.cat([b["image"] for b in batches]), torch.from_numpy(images))
    shuffled = list(
        shard.iter_torch_batches(batch_size=10, local_shuffle_buffer_size=20, local_shuffle_seed=1)
    )
    ids = torch.cat([b["id"] for b in shuffled])
    assert sorted(ids.tolist()) == list(range(n)) and ids.tolist() != list(range(n))
    for b in shuffled:  # rows stay whole through the shuffle
        assert torch.equal(b["g"], b["id"].float()) and torch.equal(b["image"][:, 0, 0], b["g"] * 4)


def test_an_iter_result_is_reiterable_each_pass_one_epoch_as_in_ray(shard):
    """Lightning is given ``iter_torch_batches()`` once and loops over it every epoch."""
    batches = shard.iter_torch_batches(batch_size=32, local_shuffle_buffer_size=50)
    passes = [torch.cat([b["id"] for b in batches]) for _ in range(3)]
    for ids in passes:
        assert sorted(ids.tolist()) == list(range(N))
    assert not torch.equal(passes[0], passes[1])  # a new (shuffled) epoch each pass
    first = next(shard.iter_batches(batch_size=30))  # next() reads the first pass
    assert first["id"].tolist() == list(range(30))
