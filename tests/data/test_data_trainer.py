"""datasets= through a real trainer: the thread engine (fast) and local worker processes."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import phalanx as train
from phalanx import DataConfig, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.data import _source as source_module
from phalanx.data import read_parquet


def save_ids(out: str, name: str = "train", epochs: int = 1, batch_size: int = 32) -> None:
    """Each rank writes the ids it read in each epoch, and its batch counts."""
    rank = train.get_context().get_world_rank()
    shard = train.get_dataset_shard(name)
    for epoch in range(epochs):
        batches = list(shard.iter_batches(batch_size=batch_size))
        ids = np.concatenate([b["id"] for b in batches]) if batches else np.array([])
        np.save(os.path.join(out, f"e{epoch}_r{rank}.npy"), ids)
        train.report({"epoch": epoch, "rows": len(ids), "batches": len(batches)})


def load_ids(out: str, epoch: int, world: int) -> list[np.ndarray]:
    return [np.load(os.path.join(out, f"e{epoch}_r{r}.npy")) for r in range(world)]


def fit(fn, storage, datasets, engine=None, workers=2, config=None, **kwargs):
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, engine=engine),
        run_config=RunConfig(name="data", storage_path=storage, **kwargs),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=["train"]),
    ).fit()


def write_parquet_folder(folder, files: int = 3, rows: int = 1001) -> int:
    os.makedirs(folder)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows)
        table = pa.table({"id": ids, "x": ids.astype(np.float32)})
        pq.write_table(table, os.path.join(folder, f"part-{i}.parquet"), row_group_size=100)
    return files * rows


def test_thread_engine_splits_train_and_gives_valid_whole(storage, tmp_path):
    out = str(tmp_path)

    def loop(config):
        save_ids(config["out"])
        valid = train.get_dataset_shard("valid")
        assert valid.count() == 10
        try:
            train.get_dataset_shard("test")
        except KeyError as exc:
            assert "train" in str(exc) and "valid" in str(exc)

    datasets = {"train": {"id": np.arange(101)}, "valid": pd.DataFrame({"id": range(10)})}
    fit(loop, storage, datasets, engine="thread", config={"out": out})
    ids = load_ids(out, 0, 2)
    assert [len(i) for i in ids] == [50, 50] and not set(ids[0]) & set(ids[1])


def test_a_dataset_factory_is_called_again_on_retry(storage, tmp_path):
    calls = []

    def factory():
        calls.append(1)
        return {"id": np.arange(20)}

    flag = tmp_path / "failed-once"

    def loop():
        assert train.get_dataset_shard("train").count() == 10
        if train.get_context().get_world_rank() == 0 and not flag.exists():
            flag.write_text("")
            raise RuntimeError("the first attempt fails")

    result = fit(
        loop,
        storage,
        {"train": factory},
        engine="thread",
        failure_config=FailureConfig(max_failures=1),
    )
    assert len(calls) == 2 and result.error is None


@pytest.mark.slow
def test_processes_read_their_own_parquet_row_groups_each_epoch(storage, tmp_path):
    folder = str(tmp_path / "data")
    rows = write_parquet_folder(folder)
    out = str(tmp_path)
    dataset = read_parquet(folder, shuffle="files", seed=0)
    result = fit(
        lambda c: save_ids(c["out"], epochs=2), storage, {"train": dataset}, config={"out": out}
    )
    assert result.metrics["rows"] == rows // 2
    epochs = [load_ids(out, e, 2) for e in range(2)]
    for ids in epochs:
        assert len(ids[0]) == len(ids[1]) == rows // 2
        assert not set(ids[0].tolist()) & set(ids[1].tolist())
    assert epochs[0][0].tolist() != epochs[1][0].tolist()  # the row groups were reshuffled


@pytest.mark.slow
def test_processes_share_one_copy_of_a_large_dataframe(storage, tmp_path, monkeypatch):
    written = []
    write = source_module._write_shared
    monkeypatch.setattr(
        source_module, "_write_shared", lambda t: written.append(write(t)) or written[-1]
    )
    monkeypatch.setattr(source_module, "INLINE_BYTES", 1 << 20)
    n = 300_000
    df = pd.DataFrame({"id": np.arange(n), "x": np.ones(n), "y": np.zeros(n)})
    out = str(tmp_path)
    fit(lambda c: save_ids(c["out"], batch_size=4096), storage, {"train": df}, config={"out": out})
    ids = load_ids(out, 0, 2)
    assert sorted(np.concatenate(ids).tolist()) == list(range(n))
    assert len(written) == 1 and not os.path.exists(written[0])  # one copy, removed after


@pytest.mark.slow
def test_processes_with_a_path_string(storage, tmp_path):
    folder = str(tmp_path / "data")
    rows = write_parquet_folder(folder, files=2, rows=77)
    out = str(tmp_path)
    fit(
        lambda c: save_ids(c["out"], batch_size=10),
        storage,
        {"train": folder},
        config={"out": out},
        workers=3,
    )
    ids = load_ids(out, 0, 3)
    assert [len(i) for i in ids] == [rows // 3] * 3
    assert len(set(np.concatenate(ids).tolist())) == rows // 3 * 3
