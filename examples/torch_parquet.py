"""Train a linear model with DDP on 2 workers, streaming a Parquet folder with iter_torch_batches.

    python examples/torch_parquet.py [--workers 2] [--epochs 4] [--rows 200000]

The data (a synthetic regression task) is written as several Parquet files. The trainer is
given the folder's path: each worker reads only the row groups of its own shard, in a new order
every epoch (``shuffle="files"``), and every rank gets the same number of rows, so DDP ranks
run the same number of steps.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import phalanx as train
import phalanx.data
from phalanx import RunConfig, ScalingConfig
from phalanx.torch import TorchTrainer, prepare_model

FEATURES = [f"x{i}" for i in range(8)]


def write_data(folder: str, rows: int, files: int = 4, seed: int = 0) -> None:
    """``y = x @ w + noise``, in ``files`` Parquet files of 10k-row row groups."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=len(FEATURES)).astype(np.float32)
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        x = rng.normal(size=(len(part), len(FEATURES))).astype(np.float32)
        y = x @ weights + 0.01 * rng.normal(size=len(part)).astype(np.float32)
        columns = {name: x[:, j] for j, name in enumerate(FEATURES)} | {"y": y}
        pq.write_table(pa.table(columns), f"{folder}/part-{i}.parquet", row_group_size=10_000)


def train_func(config: dict) -> None:
    torch.manual_seed(0)
    model = prepare_model(nn.Linear(len(FEATURES), 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    shard = train.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        total, steps, start = 0.0, 0, time.perf_counter()
        for batch in shard.iter_torch_batches(batch_size=config["batch_size"]):
            x = torch.stack([batch[name] for name in FEATURES], dim=1)
            loss = nn.functional.mse_loss(model(x).squeeze(1), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        train.report(
            {
                "epoch": epoch,
                "loss": total / max(steps, 1),
                "steps": steps,
                "rows_per_s": steps * config["batch_size"] / (time.perf_counter() - start),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        write_data(data, args.rows)
        result = TorchTrainer(
            train_func,
            train_loop_config={"lr": 0.05, "epochs": args.epochs, "batch_size": args.batch_size},
            scaling_config=ScalingConfig(num_workers=args.workers),
            run_config=RunConfig(name="torch_parquet", storage_path=os.path.join(tmp, "runs")),
            datasets={"train": phalanx.data.read_parquet(data, shuffle="files")},
        ).fit()
        for row in result.metrics_dataframe.to_dict("records"):
            print(
                f"epoch {row['epoch']}: loss {row['loss']:.5f}, {row['steps']} steps per rank, "
                f"{row['rows_per_s']:,.0f} rows/s per rank"
            )
        assert result.metrics["loss"] < 0.01, result.metrics


if __name__ == "__main__":
    main()
