"""Ray Train's "Data Loading and Preprocessing" guide, as a Ray user's script runs it, with
phalanx imports.

Read from https://docs.ray.io/en/latest/train/user-guides/data-loading-preprocessing.html
(Ray 2.60): ``get_dataset_shard`` + ``iter_torch_batches`` in a TorchTrainer loop,
``DataConfig(datasets_to_split=[...])``, ``DataConfig.default_ingest_options()`` /
``execution_options``, preprocessing a dataset before training (a fitted preprocessor, then
``map_batches``), and a column of equal-length lists becoming a 2-D tensor as Ray Data gives it.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import phalanx as train
import phalanx.data
from phalanx import DataConfig, RunConfig, ScalingConfig
from phalanx.preprocess import BatchMapper, StandardScaler

torch = pytest.importorskip("torch")
from phalanx.torch import TorchTrainer  # noqa: E402


def tabular(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    df = pd.DataFrame(x, columns=["f0", "f1", "f2"])
    df["target"] = (x @ np.array([1.5, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    df["row"] = np.arange(rows)
    return df


@pytest.fixture
def run_config(tmp_path) -> RunConfig:
    return RunConfig(storage_path=str(tmp_path / "runs"), name="ingest")


@pytest.mark.slow
def test_torch_loop_over_split_train_and_whole_validation_with_ingest_options(run_config):
    df = tabular(1000)
    train_dataset = phalanx.data.from_pandas(df.iloc[:800])
    valid_dataset = phalanx.data.from_pandas(df.iloc[800:])
    feature_columns = ["f0", "f1", "f2"]

    def train_loop_per_worker(config):
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        shard = train.get_dataset_shard("train")
        for epoch in range(config["epochs"]):
            seen = []
            for batch in shard.iter_torch_batches(batch_size=32, dtypes=torch.float32):
                inputs = torch.cat([batch[c].unsqueeze(1) for c in feature_columns], dim=1)
                loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), batch["target"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen.extend(batch["row"].long().tolist())
            valid = train.get_dataset_shard("valid")
            valid_rows = sum(len(b["row"]) for b in valid.iter_batches(batch_size=64))
            train.report(
                {"epoch": epoch, "loss": loss.item(), "rows": json.dumps(seen), "valid": valid_rows}
            )

    options = DataConfig.default_ingest_options()
    options.resource_limits = options.resource_limits.copy(object_store_memory=64 << 20)
    options.preserve_order = True
    result = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_dataset, "valid": valid_dataset},
        dataset_config=DataConfig(datasets_to_split=["train"], execution_options=options),
        run_config=run_config,
    ).fit()
    history = result.all_ranks_metrics_dataframe
    last = history[history["epoch"] == 2]
    rows = [json.loads(r) for r in last.sort_values("rank")["rows"]]
    # "train" is split: disjoint halves covering every row; "valid" is not: each rank reads all.
    assert sorted(rows[0] + rows[1]) == list(range(800))
    assert not set(rows[0]) & set(rows[1])
    assert rows[0] == sorted(rows[0])  # preserve_order: rows come in order
    assert set(last["valid"]) == {200}
    first = history[(history["epoch"] == 0) & (history["rank"] == 0)]["loss"].iloc[0]
    assert result.metrics["loss"] < first


def test_default_ingest_options_are_accepted_and_bad_options_are_not():
    options = DataConfig.default_ingest_options()
    assert hasattr(options, "resource_limits") and hasattr(options, "preserve_order")
    DataConfig(execution_options={"train": options})
    with pytest.raises(ValueError, match=r"(?s)execution_options.*HINT"):
        DataConfig(execution_options={"train": 3})


def test_no_limit_and_rays_infinite_limit_leave_read_ahead_alone():
    from phalanx._foundation.execution_options import (
        ExecutionOptions,
        ExecutionResources,
        prefetch_bytes,
    )

    assert prefetch_bytes(None) is None
    assert prefetch_bytes(ExecutionOptions()) is None
    unlimited = ExecutionOptions(
        resource_limits=ExecutionResources(object_store_memory=float("inf"))
    )
    assert prefetch_bytes(unlimited) is None
    assert prefetch_bytes(ExecutionOptions(ExecutionResources(object_store_memory=1e6))) == 10**6


def test_execution_options_object_store_limit_caps_read_ahead(tmp_path):
    df = tabular(50_000)
    path = tmp_path / "rows.parquet"
    df.to_parquet(path, row_group_size=2048)
    options = DataConfig.default_ingest_options()
    options.resource_limits = options.resource_limits.copy(object_store_memory=1)
    from phalanx.data._ingest import shard_datasets

    (shards,) = shard_datasets(
        {"train": str(path)}, DataConfig(execution_options=options), world_size=1
    )
    capped = shards["train"]
    (free,) = shard_datasets({"train": str(path)}, DataConfig(), world_size=1)
    # Same rows either way; the limit only bounds how far the reader runs ahead.
    got = np.concatenate(
        [b["row"] for b in capped.iter_batches(batch_size=4096, prefetch_batches=8)]
    )
    want = np.concatenate([b["row"] for b in free["train"].iter_batches(batch_size=4096)])
    np.testing.assert_array_equal(got, want)
    assert capped._prefetch_bytes == 1 and free["train"]._prefetch_bytes is None


@pytest.mark.slow
def test_preprocess_before_training_fit_transform_then_map_batches(run_config):
    df = tabular(600)
    dataset = phalanx.data.from_pandas(df)
    scaler = StandardScaler(columns=["f0", "f1"])
    dataset = scaler.fit_transform(dataset)
    dataset = dataset.map_batches(
        lambda batch: {**batch, "f2": batch["f2"] * 10}, batch_format="numpy"
    )
    assert dataset.count() == 600
    assert abs(dataset.mean(on="f0")) < 1e-5
    first = dataset.take(1)[0]
    assert first["f2"] == pytest.approx(df["f2"].iloc[0] * 10)

    def train_func():
        shard = train.get_dataset_shard("train").to_pandas()
        train.report({"mean_f1": float(shard["f1"].mean()), "rows": len(shard)})

    result = TorchTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": dataset},
        run_config=run_config,
    ).fit()
    per_rank = result.all_ranks_metrics_dataframe
    assert per_rank["rows"].sum() == 600
    assert abs(np.average(per_rank["mean_f1"], weights=per_rank["rows"])) < 1e-5


def test_a_column_of_equal_length_lists_becomes_a_2d_tensor():
    df = pd.DataFrame(
        {"image": [np.full(4, i, np.float32) for i in range(10)], "label": np.arange(10)}
    )
    dataset = phalanx.data.from_pandas(df)
    batch = next(iter(dataset.iter_torch_batches(batch_size=8)))
    assert batch["image"].shape == (8, 4) and batch["image"].dtype == torch.float32
    assert batch["image"][3].tolist() == [3.0] * 4
    numpy_batch = dataset.take_batch(5)
    assert numpy_batch["image"].shape == (5, 4)


def test_a_ragged_list_column_is_described_not_printed():
    rows = [np.arange(1000.0), np.arange(3.0)]
    dataset = phalanx.data.from_pandas(pd.DataFrame({"tokens": rows}))
    with pytest.raises(TypeError) as info:
        next(iter(dataset.iter_torch_batches(batch_size=2)))
    message = str(info.value)
    assert "'tokens'" in message and "HINT" in message
    assert "999.0" not in message and len(message) < 800


def test_batch_mapper_applies_a_lambda_and_checks_pickling_at_construction():
    import threading

    add = BatchMapper(lambda df: df.assign(f0=df["f0"] + 1), batch_format="pandas")
    out = add.transform(phalanx.data.from_pandas(tabular(10)))
    assert out.take(1)[0]["f0"] == pytest.approx(tabular(10)["f0"].iloc[0] + 1)
    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"(?s)cannot be pickled.*HINT"):
        BatchMapper(lambda df: (lock, df)[1], batch_format="pandas")
